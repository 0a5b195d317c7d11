"""`denpex signatures list|show|test|docs`: browse and check the signature catalog."""

from __future__ import annotations

import argparse
import sys

from denpex.cli.common import UsageError, catalog_for, describe_signature, local_signature_dirs

DESCRIPTION = """\
Browse the failure signatures denpex matches, and check your own before you use them.
Site-local signatures live in a folder of YAML files (format: signatures/README.md), given
with --signatures DIR or DENPEX_SIGNATURES; an entry with a shipped id replaces it.
"""
EPILOG = """\
examples:
  denpex signatures list --category gpu.fallen_off_bus
  denpex signatures show gpu.fallen_off_bus.xid79
  denpex signatures test my-signatures/          # validate and run every example
  denpex signatures docs --output docs/signatures.md
"""


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "signatures",
        help="list, show and test failure signatures",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--signatures",
        metavar="DIR",
        action="append",
        default=[],
        help="also load site-local signatures from DIR; may repeat",
    )
    actions = parser.add_subparsers(dest="signatures_command", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="one line per signature")
    listing.add_argument("--category", help="only this taxonomy category (or a prefix: gpu.)")
    listing.add_argument("--json", action="store_true", help="JSON objects instead of text")
    show = actions.add_parser("show", help="everything about one signature")
    show.add_argument("id")
    show.add_argument("--json", action="store_true")
    test = actions.add_parser("test", help="validate signature files and run their examples")
    test.add_argument(
        "paths",
        nargs="*",
        metavar="FILE_OR_DIR",
        help="YAML files or folders (default: the shipped catalog and --signatures)",
    )
    test.add_argument(
        "--signatures-dir",
        metavar="DIR",
        action="append",
        default=[],
        help="a folder of site-local signatures to test; may repeat",
    )
    docs = actions.add_parser("docs", help="the Markdown reference page")
    docs.add_argument("--output", metavar="FILE", help="write to FILE instead of stdout")
    parser.set_defaults(handler=handle)


def _as_dict(sig) -> dict:
    return {
        "id": sig.id,
        "category": sig.category,
        "severity": sig.severity,
        "sources": list(sig.sources),
        "regex": sig.regex,
        "flags": list(sig.flags),
        "summary": sig.summary,
        "action": sig.action,
        "explain": sig.explain,
        "refs": sig.refs,
        "examples": {"match": sig.examples_match, "no_match": sig.examples_no_match},
        "file": sig.file,
        "line": sig.line,
        "overrides": sig.overrides,
    }


def handle(args: argparse.Namespace) -> int:
    from denpex.core import jsonio

    command = args.signatures_command
    if command == "test":
        return _test(args)
    catalog = catalog_for(args)
    if command == "list":
        chosen = [
            s
            for s in catalog.signatures
            if not args.category
            or s.category == args.category
            or (args.category.endswith(".") and s.category.startswith(args.category))
        ]
        if args.category and not chosen:
            raise UsageError(f"no signature has category {args.category!r}")
        if args.json:
            sys.stdout.buffer.write(
                jsonio.dumps([_as_dict(s) for s in chosen], pretty=True) + b"\n"
            )
        else:
            for s in chosen:
                print(f"{s.id:<58} {s.severity:<8} {s.action:<15} {s.summary}")
        return 0
    if command == "show":
        sig = catalog.by_id.get(args.id)
        if sig is None:
            raise UsageError(f"no signature {args.id!r} (see `denpex signatures list`)")
        if args.json:
            sys.stdout.buffer.write(jsonio.dumps(_as_dict(sig), pretty=True) + b"\n")
            return 0
        print(describe_signature(sig))
        return 0
    from denpex.catalog.reference import render_markdown
    from denpex.core import load_taxonomy

    text = render_markdown(catalog, load_taxonomy())
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle_:
            handle_.write(text)
    else:
        sys.stdout.write(text)
    return 0


def _test(args: argparse.Namespace) -> int:
    from denpex.catalog.check import check

    local = [*args.signatures_dir, *local_signature_dirs(args)]
    problems = check(args.paths or None, local=local)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s)", file=sys.stderr)
        return 1
    what = " ".join(args.paths + local) or "the shipped catalog"
    print(f"OK: every signature in {what} is valid and its examples agree with the matcher")
    return 0
