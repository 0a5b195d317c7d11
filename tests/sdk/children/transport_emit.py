"""Emits SDK evidence through the process-wide transport, as a training script would.

Usage: transport_emit.py COUNT [--fork] [--exit-hard]. Each message is train.sdc evidence whose
id names the pid and index. --fork: after the first message, fork a child (like a DataLoader
worker) that emits COUNT messages of its own. --exit-hard: the child leaves with os._exit after
closing the transport itself. The SDK picks socket or stderr from the environment.
"""

from __future__ import annotations

import os
import sys

from denpex.core.events import Event, Evidence
from denpex.sdk.transport import default_emit, default_transport


def evidence(index: int) -> Evidence:
    return Evidence(
        id=f"sdk-{os.getpid()}-{index}",
        event=Event(body=f"message {index}", source="sdk", kind="state", rank=2),
        signature="train.sdc.replica_mismatch",
        category="train.sdc",
        severity="error",
        captures={"index": str(index)},
    )


def main() -> int:
    count = int(sys.argv[1])
    fork = "--fork" in sys.argv
    default_emit(evidence(0))
    if fork:
        pid = os.fork()
        if pid == 0:
            for index in range(count):
                default_emit(evidence(index))
            if "--exit-hard" in sys.argv:
                default_transport().close()
                os._exit(0)
            sys.exit(0)
        os.waitpid(pid, 0)
    for index in range(1, count):
        default_emit(evidence(index))
    print(f"mode={default_transport().mode}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
