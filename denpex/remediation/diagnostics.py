"""Hardware diagnostics as a command run from the control plane (`dcgmi diag --host H -r L`
by default): the one place every backend and the spare pool run them, so "passed" means the
same thing for a host coming back to service and for a spare being offered.

It must never report a pass it did not see: only exit status 0 passes; a command that cannot
start is a BackendError and one past its timeout a BackendTimeout (no verdict on the host).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Mapping, Sequence

from denpex.remediation.backend import (
    BackendError,
    BackendTimeout,
    Operation,
    StepResult,
    Target,
    result,
)

DEFAULT_COMMAND = ("dcgmi", "diag", "--host", "{host}", "-r", "{level}")


def command_for(template: Sequence[str], host: str, level: int) -> list[str]:
    return [part.format(host=host, level=level) for part in template]


def run(
    target: Target,
    *,
    level: int,
    timeout_s: float,
    command: Sequence[str] = DEFAULT_COMMAND,
    env: Mapping[str, str] | None = None,
) -> StepResult:
    """Run the diagnostics command for `target` at `level`; ok only on exit status 0."""
    started = time.time_ns()
    argv = command_for(command, target.host, level)
    try:
        done = subprocess.run(
            argv,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        code, output = done.returncode, done.stdout + done.stderr
    except FileNotFoundError:
        # not a verdict on the host: the plan stops for a human instead of sending it to RMA
        raise BackendError(
            f"diagnostics: {argv[0]} not found (install DCGM or set --diagnostics-command)"
        ) from None
    except subprocess.TimeoutExpired:
        raise BackendTimeout(
            f"diagnostics: {' '.join(argv)} did not finish in {timeout_s:g} s"
        ) from None
    passed = code == 0
    return result(
        Operation.DIAGNOSTICS,
        target,
        started,
        ok=passed,
        changed=True,
        detail=f"{' '.join(argv)}: {'passed' if passed else f'failed ({code})'}",
        record={"command": argv, "returncode": code, "output": output[-4000:], "level": level},
    )
