"""Names the rank that did not arrive when a collective gives up waiting (`train.hang`).

While the job runs, each rank's main thread is sampled every tick (rank_state: three small
/proc reads per rank), so each rank's current and past blocks are known with their start
and end. When the job's output shows a collective timing out (categories in hang.yaml), the
rank that was blocked outside communication when the first failure appeared is named, with
what it was blocked in and for how long. Runs in the analyzer process: it never slows the
job, never signals a rank, and its optional `py-spy dump` is bounded and taken once.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field

from denpex.core.detectors import detector_evidence
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.lite.job_processes import JobProcess
from denpex.lite.rank_state import (
    ThreadState,
    hang_settings,
    open_files,
    sample_thread,
    syscall_table,
    wchan,
)

DETECTOR = "train.hang.rank_blocked"
MAX_BLOCKS_KEPT = 64  # per rank: older finished blocks are forgotten


@dataclass(slots=True)
class Block:
    """One stretch of samples in which a rank's main thread stayed in the same state."""

    state: ThreadState
    since: float  # monotonic
    since_ns: int  # wall clock
    until: float
    wchan: str = ""
    files: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.until - self.since


@dataclass(slots=True)
class RankTrack:
    rank: int
    pid: int
    current: Block | None = None
    past: list[Block] = field(default_factory=list)


class HangWatch:
    """Samples rank processes; `findings` names the straggler after a collective timeout."""

    def __init__(self, roots: Roots, *, host: str | None = None) -> None:
        self.roots = roots
        self.host = host
        self.settings = hang_settings()
        self.table = syscall_table()
        self.ranks: dict[int, RankTrack] = {}
        self.samples = 0
        self.sample_seconds = 0.0  # time spent sampling: the cost, reported in stats
        self.stacks: dict[int, str] = {}  # rank → py-spy dump, taken once
        self.stack_note: str | None = None

    def sample(self, ranks: dict[int, JobProcess]) -> None:
        """One sample of every live rank process's main thread."""
        started = time.perf_counter()
        now, now_ns = time.monotonic(), time.time_ns()
        for rank, proc in ranks.items():
            track = self.ranks.get(rank)
            if track is None or track.pid != proc.pid:
                track = self.ranks[rank] = RankTrack(rank, proc.pid)
            if not proc.alive:
                continue
            state = sample_thread(self.roots, proc.pid, self.table)
            if state is None:
                continue
            block = track.current
            if block is not None and block.state.key == state.key:
                block.until = now
                continue
            if block is not None:
                track.past = [*track.past, block][-MAX_BLOCKS_KEPT:]
            block = track.current = Block(state, now, now_ns, now)
            if state.kind != "wait":
                block.wchan = wchan(self.roots, proc.pid)
                block.files = open_files(self.roots, proc.pid)
        self.samples += 1
        self.sample_seconds += time.perf_counter() - started

    def blocked_at(self, when: float) -> list[tuple[RankTrack, Block]]:
        """(rank, block) of ranks blocked outside communication at monotonic time `when` for
        at least min_blocked_s, longest first."""
        minimum = float(self.settings["min_blocked_s"])
        slack = 2 * float(self.settings["sample_interval_s"])
        found = []
        for track in self.ranks.values():
            for block in [*track.past, *([track.current] if track.current else [])]:
                held = min(block.until, when) - block.since
                if (
                    block.state.kind != "wait"
                    and block.since <= when <= block.until + slack
                    and held >= minimum
                ):
                    found.append((track, block))
        return sorted(found, key=lambda tb: tb[1].since)

    def take_stacks(self, when: float) -> None:
        """The Python stack of each rank blocked now (py-spy, once per rank, bounded)."""
        spy = shutil.which("py-spy")
        if spy is None:
            self.stack_note = "py-spy is not installed: no Python stack (pip install py-spy)"
            return
        timeout = float(self.settings["pyspy_timeout_s"])
        for track, _block in self.blocked_at(when):
            if track.rank in self.stacks:
                continue
            try:
                done = subprocess.run(
                    [spy, "dump", "--nonblocking", "--pid", str(track.pid)],  # never pauses it
                    capture_output=True,
                    timeout=timeout,
                    stdin=subprocess.DEVNULL,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                self.stacks[track.rank] = f"py-spy dump failed: {exc}"
                continue
            text = done.stdout.decode("utf-8", "replace").strip()
            if done.returncode != 0:
                text = f"py-spy dump failed: {done.stderr.decode('utf-8', 'replace').strip()}"
            self.stacks[track.rank] = text[: int(self.settings["stack_max_chars"])]

    def innermost_frame(self, rank: int) -> str | None:
        """`function (file.py:line)` where the rank's main thread was, from its py-spy dump."""
        return innermost_frame(self.stacks.get(rank, ""))

    def findings(self, evidence: list[Evidence], first_failure: float | None) -> list[Evidence]:
        """Evidence of each straggler, when a collective timed out (a trigger category is in
        `evidence`) and a rank was blocked outside communication at the first failure."""
        triggers = set(self.settings["trigger_categories"])
        if first_failure is None or not any(e.category in triggers for e in evidence):
            return []
        out = []
        for track, block in self.blocked_at(first_failure):
            seconds = max(0.0, min(block.until, first_failure) - block.since)
            doing = f"blocked in {block.state.what}"
            if block.state.kind == "running":
                doing = "running on a CPU, not in a collective,"
            frame = self.innermost_frame(track.rank)
            values = {
                "doing": doing,
                "seconds": seconds,
                "in_frame": f" in {frame}" if frame else "",
            }
            captures = {"rank": str(track.rank), "blocked_in": block.state.what}
            attrs: dict[str, str | int | float | bool] = {
                "blocked_in": block.state.what,
                "state": block.state.kind,
                "blocked_s": round(seconds, 1),
                "attribution": "job",
            }
            if block.wchan:
                attrs["wchan"] = block.wchan
            if block.files:
                attrs["open_files"] = ", ".join(block.files)
            stack = self.stacks.get(track.rank)
            if stack:
                attrs["python_stack"] = stack
            elif self.stack_note:
                attrs["python_stack_note"] = self.stack_note
            event = Event(
                body="",
                ts_ns=block.since_ns,
                host=self.host,
                source="proc",
                kind="state",
                rank=track.rank,
                pid=track.pid,
                attrs=attrs,
            )
            found = detector_evidence(event, DETECTOR, captures=captures, values=values)
            event.body = f"{found.summary} while the other ranks waited for it in a collective"
            out.append(found)
        return out


def innermost_frame(dump: str) -> str | None:
    """The first frame under the main thread's header in `py-spy dump` output."""
    lines = dump.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("Thread ") and '"MainThread"' in line:
            for frame in lines[index + 1 :]:
                if frame.startswith("    ") and frame.strip():
                    return frame.strip()
                if not frame.startswith(" "):
                    break
    return None
