"""The `denpex` command: parses the subcommand and hands over to its module.

Thin by design: each subcommand lives in its own module (run.py, scan.py); this one only
builds the parser, prints the version, and turns expected errors into one-line messages.
No subcommand imports this module (what they share is in common.py).
"""

from __future__ import annotations

import argparse
import sys

from denpex import __version__
from denpex.cli.common import UsageError

EPILOG = """\
examples:
  denpex run -- torchrun --nproc-per-node 2 train.py
  denpex run --report diag.json --html diag.html -- python train.py
  python train.py 2>&1 | denpex scan --tee
  denpex scan --json node*/rank*.log kern.log
  denpex explain gpu.fallen_off_bus
  denpex agent --once
  denpex fabric check --golden golden.xml --nccl-topo /tmp/nccl-topo.xml
  denpex server --db sqlite:///var/lib/denpex/cp.db --listen 127.0.0.1:9479
  denpex policy test cases.yaml
  denpex audit verify audit.jsonl --pubkey site.pub
  denpex bundle verify denpex-airgap-bundle-0.1.0-x86_64.tar.gz --pubkey release.pub

exit status: `denpex run` exits with the job's own status (128+N when a signal N killed it);
`denpex scan` exits 0 when no failure was found, 1 when one was diagnosed, 2 on bad input.
"""


def build_parser() -> argparse.ArgumentParser:
    from denpex.cli import (
        agent,
        audit,
        bundle,
        compliance,
        doctor,
        explain,
        fabric,
        login,
        node_check,
        policy,
        remediate,
        run,
        scan,
        server,
        signatures,
    )

    parser = argparse.ArgumentParser(
        prog="denpex",
        description="Find out why a training job failed, from its output and the host's evidence.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument(
        "--verbose", action="store_true", help="with --version: also the backends in use"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    run.add_parser(commands)
    scan.add_parser(commands)
    signatures.add_parser(commands)
    explain.add_parser(commands)
    doctor.add_parser(commands)
    agent.add_parser(commands)
    fabric.add_parser(commands)
    bundle.add_parser(commands)
    server.add_parser(commands)
    policy.add_parser(commands)
    login.add_parser(commands)
    compliance.add_parser(commands)
    audit.add_parser(commands)
    remediate.add_parser(commands)
    node_check.add_parser(commands)
    return parser


def version_text(verbose: bool) -> str:
    lines = [f"denpex {__version__}"]
    if verbose:
        import platform

        import denpex._native as native
        from denpex.catalog import load_catalog

        catalog = load_catalog()
        lines.append(f"python {platform.python_version()} ({sys.executable})")
        lines.append(f"frozen: {'yes' if getattr(sys, 'frozen', False) else 'no'}")
        from denpex._native.linesearch import engine

        for name in native.NATIVE_MODULES:
            lines.append(f"{name}: {native.backend(name)}")
        lines.append(f"long lines: {engine()}")
        lines.append(f"signatures: {len(catalog)}")
        from denpex.retrieval.embedding import unavailable_reason

        reason = unavailable_reason()
        lines.append(
            f"retrieval: {'embeddings' if reason is None else 'keywords (' + reason + ')'}"
        )
        if native.extensions_disabled():
            lines.append("DENPEX_NO_EXTENSIONS=1: compiled modules disabled")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--version"]:  # answered before the subcommand modules (and their imports) load
        print(version_text(False))
        return 0
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(version_text(args.verbose))
        return 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.handler(args))
    except UsageError as exc:
        print(f"denpex {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader of our stdout went away (`denpex scan --json … | head`): not an error
        return 0
