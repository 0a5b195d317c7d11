"""`denpex node-check`: what the Slurm Prolog, Epilog and HealthCheckProgram of the bundle run
with the agent's report; the cordon a critical finding calls for is decided by the
remediation policy and guards and recorded in a local hash-chained audit file
(denpex.remediation.node_check). Thin: parse args, call the engine, print.

It must never call a scheduler itself: the engine's backend does, under the policy.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

from denpex.cli.common import UsageError

HELP = """\
examples:
  denpex agent --once --json > r.json
  denpex node-check --input r.json --policy /etc/denpex/remediation.yaml --dry-run
  denpex node-check --input r.json --node "$SLURMD_NODENAME" --audit /var/lib/denpex/node-audit.jsonl

exit status: 0 healthy, 1 a critical finding (handled as the policy says), 2 usage.
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "node-check",
        help="act on an agent report through the remediation engine (Slurm node hooks)",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--input", required=True, metavar="FILE", help="agent JSON ('-': stdin)")
    p.add_argument("--node", help="the node (default: this host's short name)")
    p.add_argument("--policy", metavar="FILE", help="remediation policy YAML (default: packaged)")
    p.add_argument(
        "--audit",
        metavar="FILE",
        default="/var/lib/denpex/node-audit.jsonl",
        help="the local hash-chained audit (default: %(default)s)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would happen; act on nothing")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    import yaml

    from denpex.core import jsonio
    from denpex.remediation import node_check
    from denpex.remediation.policy import PolicyError, default_policy, parse_policy
    from denpex.remediation.slurm import SlurmBackend

    raw = sys.stdin.buffer.read() if args.input == "-" else Path(args.input).read_bytes()
    try:
        report = jsonio.loads(raw)
    except ValueError as exc:
        raise UsageError(f"node-check: {args.input} is not the agent's JSON ({exc})") from None
    try:
        policy = (
            parse_policy(yaml.safe_load(Path(args.policy).read_text()))
            if args.policy
            else default_policy()
        )
    except (OSError, PolicyError, yaml.YAMLError) as exc:
        raise UsageError(f"node-check: policy {args.policy}: {exc}") from None
    node = args.node or socket.gethostname().split(".")[0]
    out = node_check.run(
        report,
        host=node,
        backend=SlurmBackend(),
        policy=policy,
        audit_path=Path(args.audit),
        dry=args.dry_run,
    )
    if out.get("healthy"):
        return 0
    if args.dry_run:
        would = out["dry_run"]
        steps = ", ".join(f"{s['step']}: {s['decision']}" for s in would["would"])
        print(
            f"denpex node-check: {node} {would['category']} under tier {would['tier']}: {steps}",
            file=sys.stderr,
        )
    else:
        print(
            f"denpex node-check: {node} tier {out['tier']}: {out['status']} "
            f"({'cordoned' if out.get('cordoned') else 'not cordoned'})",
            file=sys.stderr,
        )
    return 1
