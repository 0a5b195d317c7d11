"""The Slurm backend: cordon and drain with a `denpex:` reason (`scontrol update nodename=…
state=drain`), the pre-stop signal to the node's jobs (`scancel --signal=USR1 --full`),
eviction as `scontrol requeuehold` (marked in the job's Comment), requeue with `--exclude`
(ExcNodeList, then release), diagnostics through `dcgmi diag --host`, resume, and state read
back through `sinfo --json` and `squeue`.

Every operation reads the node or its jobs back before and after acting, so a repeated call
changes nothing. It must never resume a node that someone else drained (a reason that is not
ours), nor delete a job: evicted jobs are requeued, never cancelled.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Any

from denpex.core import jsonio
from denpex.remediation import diagnostics
from denpex.remediation.backend import (
    REASON_PREFIX,
    Backend,
    BackendError,
    BackendTimeout,
    NodeState,
    Operation,
    StepResult,
    Target,
    result,
)

EVICTED_COMMENT = "denpex: evicted from "
# SIGUSR1 terminates a process that does not handle it: only jobs that say they handle it
# (`sbatch --comment=denpex:checkpoint`, which the SDK's dx.watch does) are signalled
CHECKPOINT_OPT_IN = "denpex:checkpoint"
DRAIN_FLAGS = {"DRAIN", "DRAINING", "DRAINED"}


class SlurmBackend(Backend):
    name = "slurm"

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        diagnostics_command: Sequence[str] = diagnostics.DEFAULT_COMMAND,
    ) -> None:
        self.env = dict(os.environ if env is None else env)
        self.diagnostics_command = tuple(diagnostics_command)

    def available(self) -> str | None:
        lacking = [n for n in ("scontrol", "sinfo", "squeue", "scancel") if not shutil.which(n)]
        if lacking:
            return f"Slurm client commands not found: {', '.join(lacking)} (install slurm-client)"
        return None

    # --- commands --------------------------------------------------------------------------

    def _run(self, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                list(argv), env=self.env, capture_output=True, text=True, timeout=timeout_s
            )
        except FileNotFoundError:
            raise BackendError(f"slurm: {argv[0]} not found (install slurm-client)") from None
        except subprocess.TimeoutExpired:
            raise BackendTimeout(
                f"slurm: {' '.join(argv)} did not finish in {timeout_s:g} s"
            ) from None

    def _must(self, argv: Sequence[str], timeout_s: float) -> str:
        done = self._run(argv, timeout_s)
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip().splitlines()
            raise BackendError(f"slurm: {' '.join(argv)}: {message[-1] if message else ''}")
        return done.stdout

    def _node(self, host: str, timeout_s: float) -> dict[str, Any]:
        data = jsonio.loads(self._must(["sinfo", "--json", "--nodes", host], timeout_s))
        for node in data.get("nodes", []):
            if node.get("name") == host:
                return dict(node)
        raise BackendError(f"slurm: no node {host!r} (sinfo --json)")

    def _jobs(self, host: str, timeout_s: float, *, states: str = "running") -> list[str]:
        out = self._must(["squeue", "-h", "-w", host, "-t", states, "-o", "%i"], timeout_s)
        return [line.strip() for line in out.splitlines() if line.strip()]

    def _evicted(self, host: str, timeout_s: float) -> list[str]:
        """Jobs we evicted from `host` and have not yet released (their Comment marks them)."""
        out = self._must(["squeue", "-h", "-t", "all", "-o", "%i|%T|%k"], timeout_s)
        jobs = []
        for line in out.splitlines():
            job, _, rest = line.partition("|")
            state, _, comment = rest.partition("|")
            mark = EVICTED_COMMENT + host
            if comment.split(" | ")[0] == mark and state not in ("RUNNING", "COMPLETED"):
                jobs.append(job.strip())
        return jobs

    def _comments(self, jobs: Sequence[str], timeout_s: float) -> dict[str, str]:
        if not jobs:
            return {}
        out = self._must(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i|%k"], timeout_s)
        found = {}
        for line in out.splitlines():
            job, _, comment = line.partition("|")
            found[job.strip()] = "" if comment == "(null)" else comment
        return found

    def state(self, target: Target, *, timeout_s: float) -> NodeState:
        node = self._node(target.host, timeout_s)
        return self._state(target.host, node, self._jobs(target.host, timeout_s))

    def _state(self, host: str, node: Mapping[str, Any], jobs: Sequence[str]) -> NodeState:
        flags = {str(f).upper() for f in node.get("state_flags") or []}
        base = str(node.get("state", "")).lower()
        draining = bool(flags & DRAIN_FLAGS) or base in ("drain", "drained", "draining")
        down = base in ("down", "fail", "future") or "NOT_RESPONDING" in flags
        reason = node.get("reason") or None
        return NodeState(
            host,
            schedulable=not draining and not down,
            drained=draining and not jobs,
            reason=str(reason) if reason else None,
            jobs=tuple(jobs),
            raw={k: node.get(k) for k in ("state", "state_flags", "reason", "partitions")},
        )

    def _record(self, target: Target, timeout_s: float, **extra: Any) -> dict[str, Any]:
        return {"node": self.state(target, timeout_s=timeout_s).to_dict(), **extra}

    def pool_of(self, host: str, *, timeout_s: float) -> str | None:
        partitions = self._node(host, timeout_s).get("partitions") or []
        return str(partitions[0]) if partitions else None

    def pool_hosts(self, pool: str, *, timeout_s: float) -> tuple[str, ...]:
        out = self._must(["sinfo", "-h", "-N", "-p", pool, "-o", "%N"], timeout_s)
        return tuple(sorted({line.strip() for line in out.splitlines() if line.strip()}))

    # --- operations ------------------------------------------------------------------------

    def _set_drain(
        self, op: Operation, target: Target, reason: str, timeout_s: float
    ) -> StepResult:
        started = time.time_ns()
        before = self.state(target, timeout_s=timeout_s)
        if not before.schedulable and before.reason == reason:
            return result(
                op,
                target,
                started,
                ok=True,
                changed=False,
                detail=f"{target.host} already drained: {reason}",
                record=self._record(target, timeout_s),
            )
        if not before.schedulable and not (before.reason or "").startswith(REASON_PREFIX):
            raise BackendError(
                f"slurm: {target.host} is already drained by someone else ({before.reason}); "
                "denpex leaves it as it is"
            )
        argv = ["scontrol", "update", f"nodename={target.host}", "state=drain", f"reason={reason}"]
        self._must(argv, timeout_s)
        after = self.state(target, timeout_s=timeout_s)
        return result(
            op,
            target,
            started,
            ok=not after.schedulable,
            changed=True,
            detail=f"{' '.join(argv[:4])} reason={reason!r}",
            record={"node": after.to_dict(), "command": argv},
        )

    def cordon(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        return self._set_drain(Operation.CORDON, target, reason, timeout_s)

    def drain(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        # Slurm's drain state is both: no new jobs, running ones continue until evicted
        return self._set_drain(Operation.DRAIN, target, reason, timeout_s)

    def rma(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        return self._set_drain(Operation.RMA, target, f"{REASON_PREFIX} rma {reason}", timeout_s)

    def checkpoint(self, target: Target, *, budget_s: float) -> StepResult:
        """Signal the node's opted-in jobs with SIGUSR1 (the SDK's pre-stop checkpoint) and
        wait up to `budget_s` for each to report `saved=<step>@<ns>` in its Comment."""
        started = time.time_ns()
        comments = self._comments(self._jobs(target.host, budget_s), budget_s)
        jobs = sorted(j for j, c in comments.items() if CHECKPOINT_OPT_IN in c)
        skipped = sorted(set(comments) - set(jobs))
        for job in jobs:
            self._must(["scancel", "--signal=USR1", "--full", job], budget_s)
        deadline = time.monotonic() + budget_s
        completed: dict[str, str | None] = {job: None for job in jobs}
        while jobs and time.monotonic() < deadline:
            for job, comment in self._comments(jobs, budget_s).items():
                saved = _saved_after(comment, started)
                if saved and completed.get(job) is None:
                    completed[job] = saved
            if all(completed.values()):
                break
            time.sleep(0.2)
        done = [job for job, saved in completed.items() if saved]
        detail = f"SIGUSR1 to {len(jobs)} job(s) on {target.host}, {len(done)} saved in budget"
        if skipped:
            detail += f"; {len(skipped)} without --comment={CHECKPOINT_OPT_IN} not signalled"
        return result(
            Operation.CHECKPOINT,
            target,
            started,
            ok=len(done) == len(jobs),
            changed=bool(jobs),
            detail=detail,
            record={
                "signalled": jobs,
                "not_opted_in": skipped,
                "completed": completed,
                "seconds": round((time.time_ns() - started) / 1e9, 3),
                "budget_s": budget_s,
            },
        )

    def evict(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        started = time.time_ns()
        jobs = self._jobs(target.host, timeout_s, states="running,suspended,configuring")
        comments = self._comments(jobs, timeout_s)
        for job in jobs:
            kept = comments.get(job, "")
            mark = EVICTED_COMMENT + target.host + (f" | {kept}" if kept else "")
            self._must(["scontrol", "update", f"jobid={job}", f"Comment={mark}"], timeout_s)
            self._must(["scontrol", "requeuehold", job], timeout_s)
        # the job leaves the node once its processes ended (COMPLETING until then)
        deadline = time.monotonic() + timeout_s
        still = self._jobs(target.host, timeout_s, states="running,completing")
        while set(still) & set(jobs) and time.monotonic() < deadline:
            time.sleep(0.5)
            still = self._jobs(target.host, timeout_s, states="running,completing")
        held = self._evicted(target.host, timeout_s)
        return result(
            Operation.EVICT,
            target,
            started,
            ok=not (set(still) & set(jobs)),
            changed=bool(jobs),
            detail=f"{len(jobs)} job(s) requeued in held state from {target.host}",
            record={"evicted": jobs, "held": held, "still_running": still},
        )

    def requeue(self, target: Target, *, exclude: Sequence[str], timeout_s: float) -> StepResult:
        started = time.time_ns()
        jobs = self._evicted(target.host, timeout_s)
        excluded = ",".join(sorted(set(exclude) | {target.host}))
        comments = self._comments(jobs, timeout_s)
        for job in jobs:
            kept = comments.get(job, "").partition(" | ")[2]  # the job's own comment, restored
            self._must(
                [
                    "scontrol",
                    "update",
                    f"jobid={job}",
                    f"ExcNodeList={excluded}",
                    "StartTime=now",
                    f"Comment={kept}",
                ],
                timeout_s,
            )
            self._must(["scontrol", "release", job], timeout_s)
        return result(
            Operation.REQUEUE,
            target,
            started,
            ok=True,
            changed=bool(jobs),
            detail=f"{len(jobs)} job(s) released with --exclude={excluded}",
            record={"requeued": jobs, "exclude": excluded},
        )

    def run_diagnostics(self, target: Target, *, level: int, timeout_s: float) -> StepResult:
        return diagnostics.run(
            target,
            level=level,
            timeout_s=timeout_s,
            command=self.diagnostics_command,
            env=self.env,
        )

    def resume(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        started = time.time_ns()
        before = self.state(target, timeout_s=timeout_s)
        if before.schedulable:
            return result(
                Operation.RESUME,
                target,
                started,
                ok=True,
                changed=False,
                detail=f"{target.host} already in service",
                record={"node": before.to_dict()},
            )
        if not (before.reason or "").startswith(REASON_PREFIX):
            raise BackendError(
                f"slurm: {target.host} was drained by someone else ({before.reason}); "
                "denpex does not resume it"
            )
        argv = ["scontrol", "update", f"nodename={target.host}", "state=resume"]
        self._must(argv, timeout_s)
        # slurmctld flags a resumed node NOT_RESPONDING until its slurmd answers the next ping
        deadline = time.monotonic() + timeout_s
        after = self.state(target, timeout_s=timeout_s)
        while not after.schedulable and time.monotonic() < deadline:
            time.sleep(0.5)
            after = self.state(target, timeout_s=timeout_s)
        return result(
            Operation.RESUME,
            target,
            started,
            ok=after.schedulable,
            changed=True,
            detail=" ".join(argv),
            record={"node": after.to_dict(), "command": argv},
        )


def _saved_after(comment: str, since_ns: int) -> str | None:
    """`<step>@<ns>` of a job's `saved=` report made after `since_ns` (None: not yet)."""
    for word in comment.split():
        if word.startswith("saved="):
            step, _, at = word[len("saved=") :].partition("@")
            if at.isdigit() and int(at) >= since_ns:
                return f"{step}@{at}"
    return None
