"""`denpex agent diag [--level N]`: run DCGM's diagnostic on this node's GPUs and keep its
outcome in the agent's state folder, where the agent reads it for
`denpex_diagnostics_last_pass_timestamp_seconds` (the control plane's recovered rule).
Thin: the diagnostic is denpex.gpu.dcgm's, the record denpex.agent.host_state's.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from denpex.cli.common import UsageError

EXIT = {"pass": 0, "warn": 0, "fail": 1}  # anything else (error, timeout): it did not run


def add_parser(agent_commands: Any, load_config: Any) -> None:
    diag = agent_commands.add_parser(
        "diag",
        help="run DCGM's GPU diagnostic and record a pass for the control plane",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    diag.add_argument("--level", type=int, default=3, help="1 short … 3 long (default), 4")
    diag.add_argument("--timeout", type=float, default=3600.0, help="seconds (default 3600)")
    diag.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS)
    diag.add_argument("--state-dir", metavar="DIR", default=argparse.SUPPRESS)
    diag.set_defaults(handler=lambda args: run_diag(args, load_config(args)))


def run_diag(args: argparse.Namespace, config: Any) -> int:
    from denpex.agent.host_state import record_diagnostics
    from denpex.gpu.dcgm.collector import run_diagnostics

    if args.level not in (1, 2, 3, 4):
        raise UsageError("--level: 1, 2, 3 or 4")
    options = config.collector("dcgm").options
    result = run_diagnostics(args.level, deadline=args.timeout, options=options)
    if result.verdict not in EXIT:
        print(f"denpex agent diag: did not run: {result.error}", file=sys.stderr)
        return 2
    passed = result.verdict != "fail"
    record_diagnostics(config.state_dir, level=args.level, tool="dcgm", passed=passed)
    for test in result.failed:
        print(
            f"  failed: {test.name} (GPU {test.gpu}): {test.message or test.info}", file=sys.stderr
        )
    print(f"denpex agent diag: level {args.level}: {result.verdict}", file=sys.stderr)
    return EXIT[result.verdict]
