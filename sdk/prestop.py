"""The pre-stop checkpoint (DESIGN §7): before remediation evicts a job, it sends SIGUSR1; the
handler installed by `dx.watch(..., prestop=hook | prestop_path=PATH)` only raises a flag, and
the next `Guard.step()` (a step boundary, where model and optimizer agree) calls the user's
hook or `dx.save`s model and optimizer state, then reports completion.

Why a signal and not a message on the SDK socket: the signal reaches every rank of every node
through the scheduler alone (`scancel --signal=USR1`, a Kubernetes preStop hook) with no
listener to keep alive in the training process, and every rank sees it before its next step.
Completion is reported where the remediation backend can read it: the Slurm job's own Comment
(`denpex:checkpoint saved=<step>@<unix ns>`, which the job's owner may set) and, when
DENPEX_PRESTOP_DIR is set, a JSON file there. It must never checkpoint inside the signal
handler (mid-step state), and never raise into the training loop.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

OPT_IN = "denpex:checkpoint"  # the Slurm Comment that says this job handles SIGUSR1
Hook = Callable[[int], None]


def _slurm_comment(text: str) -> bool:
    job = os.environ.get("SLURM_JOB_ID")
    scontrol = shutil.which("scontrol")
    if not job or scontrol is None:
        return False
    done = subprocess.run(
        [scontrol, "update", f"jobid={job}", f"Comment={text}"],
        capture_output=True,
        timeout=30,
    )
    return done.returncode == 0


class PreStop:
    """Installed by the Guard; `pending` is set by SIGUSR1 and served by `serve(step)`."""

    def __init__(self, hook: Hook, *, rank: int = 0) -> None:
        self.hook = hook
        self.rank = rank
        self.pending = False
        self.completed: list[dict[str, Any]] = []
        self._previous: Any = None
        self._installed = False

    def install(self) -> bool:
        """Handle SIGUSR1 (only the main thread may); say this job opts in (Slurm Comment)."""
        if threading.current_thread() is not threading.main_thread():
            print(
                "denpex: pre-stop checkpoint off (dx.watch not on the main thread)", file=sys.stderr
            )
            return False
        self._previous = signal.signal(signal.SIGUSR1, self._on_signal)
        self._installed = True
        if self.rank == 0:
            _slurm_comment(OPT_IN)
        return True

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.pending = True  # the checkpoint itself runs at the next step boundary
        if callable(self._previous) and self._previous is not self._on_signal:
            self._previous(signum, frame)

    def serve(self, step: int) -> None:
        if not self.pending:
            return
        self.pending = False
        started = time.time_ns()
        error = None
        try:
            self.hook(step)
        except Exception as exc:  # reported, never raised into the training loop
            error = f"{type(exc).__name__}: {exc}"
            print(f"denpex: pre-stop checkpoint failed at step {step}: {error}", file=sys.stderr)
        ended = time.time_ns()
        outcome = {
            "step": step,
            "ok": error is None,
            "error": error,
            "started_ns": started,
            "ended_ns": ended,
            "rank": self.rank,
            "pid": os.getpid(),
        }
        self.completed.append(outcome)
        if error is None and self.rank == 0:
            _slurm_comment(f"{OPT_IN} saved={step}@{ended}")
        folder = os.environ.get("DENPEX_PRESTOP_DIR")
        if folder:
            from denpex.core import jsonio

            name = f"prestop-{os.environ.get('SLURM_JOB_ID', 'job')}-{self.rank}-{step}.json"
            tmp = os.path.join(folder, f".{name}.tmp")
            with open(tmp, "wb") as out:
                out.write(jsonio.dumps(outcome))
            os.replace(tmp, os.path.join(folder, name))

    def remove(self) -> None:
        if self._installed:
            signal.signal(signal.SIGUSR1, self._previous or signal.SIG_DFL)
            self._installed = False


def save_state_hook(model: Any, optimizer: Any, path: str) -> Hook:
    """A hook that dx.saves model and optimizer state (and the step) to `path`."""

    def hook(step: int) -> None:
        from denpex.sdk.checkpoint import save

        state = {"step": step, "model": model.state_dict()}
        if optimizer is not None:
            state["optimizer"] = optimizer.state_dict()
        save(state, path)

    return hook
