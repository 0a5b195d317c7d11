"""What the subcommands share: the usage error, report options, the signature catalog.

Every subcommand module imports from here and never from `main.py` or from a sibling
subcommand (that made a circle). Imports of the layers stay inside the functions, so that
`denpex --version`, which loads this module through `main.py`, stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from denpex.catalog import Catalog
    from denpex.catalog.schema import Signature
    from denpex.control.client import ReportShipper
    from denpex.lite.session import ReportOptions


class UsageError(Exception):
    """Bad arguments or input: printed as one line, exit status 2."""


def db_option(parser: argparse.ArgumentParser) -> None:
    """--db for the subcommands that open the control plane's store directly."""
    parser.add_argument(
        "--db",
        metavar="URL",
        help="sqlite:///PATH or postgresql://USER@HOST:PORT/DB "
        "(default: SQLite under the state dir; also DENPEX_SERVER_DB)",
    )


def db_url(args: argparse.Namespace) -> str:
    from denpex.control.db import default_url

    return args.db or os.environ.get("DENPEX_SERVER_DB") or default_url()


def open_store(args: argparse.Namespace):  # -> denpex.control.store.Store
    """The store at --db, migrated to the latest schema."""
    from denpex.control.db import Database, StoreError
    from denpex.control.store import Store

    try:
        db = Database(db_url(args))
        db.migrate()
    except StoreError as exc:
        raise UsageError(str(exc)) from None
    return Store(db)


def add_report_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("reports")
    group.add_argument("--report", metavar="FILE", help="write the diagnosis as JSON to FILE")
    group.add_argument("--html", metavar="FILE", help="write a self-contained HTML report to FILE")
    group.add_argument(
        "--quiet", "-q", action="store_true", help="do not print the human verdict on stderr"
    )
    color = group.add_mutually_exclusive_group()
    color.add_argument(
        "--color",
        dest="color",
        action="store_true",
        default=None,
        help="colour the verdict even when stderr is not a terminal",
    )
    color.add_argument(
        "--no-color",
        dest="color",
        action="store_false",
        help="never colour the verdict (also: NO_COLOR=1)",
    )
    parser.add_argument(
        "--signatures",
        metavar="DIR",
        action="append",
        default=[],
        help="also load the site-local signature files (*.yaml) under DIR; an entry with a "
        "shipped id replaces it; may repeat (also: DENPEX_SIGNATURES=DIR1:DIR2)",
    )


def report_options(args: argparse.Namespace, *, json_stdout: bool = False) -> ReportOptions:
    from denpex.lite.session import ReportOptions

    for path in (args.report, args.html):
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):
                raise UsageError(f"cannot write {path}: folder {folder} does not exist")
    from denpex.control.client import ReportShipper, similar_incidents_source

    shipper = ReportShipper.from_env()  # one for the report and the retrieval block both
    return ReportOptions(
        report_path=args.report,
        html_path=args.html,
        json_stdout=json_stdout,
        text=not args.quiet,
        color=args.color,
        sinks=server_sinks(shipper),
        # past incidents for the retrieval block, from the same server
        incidents=similar_incidents_source(shipper),
    )


def server_sinks(shipper: ReportShipper | None) -> list:
    """With DENPEX_SERVER_URL set: ship the diagnosis to the control plane (bounded; what
    cannot go now waits in the outbox for the next report)."""
    if shipper is None:
        return []

    def ship(diagnosis: dict, facts: dict) -> None:
        try:
            result = shipper.ship(diagnosis, facts)
        except OSError as exc:
            print(f"denpex: report not shipped: {exc}", file=sys.stderr)
            return
        if result.pending:
            print(
                f"denpex: {result.pending} report(s) wait in {shipper.outbox} for "
                f"{shipper.url} ({result.message}); they go with the next report",
                file=sys.stderr,
            )
        elif result.message:
            print(f"denpex: {result.message}", file=sys.stderr)

    return [ship]


def local_signature_dirs(args: argparse.Namespace) -> list[str]:
    """Site-local signature folders: --signatures DIR (repeatable), then DENPEX_SIGNATURES
    (os.pathsep-separated), the setting a site puts in its environment or module file."""
    dirs = list(getattr(args, "signatures", None) or [])
    env = os.environ.get("DENPEX_SIGNATURES")
    if env:
        dirs.extend(p for p in env.split(os.pathsep) if p)
    return dirs


def check_signature_dirs(args: argparse.Namespace) -> list[str]:
    """The site-local folders, each checked to exist (a usage error otherwise)."""
    local = local_signature_dirs(args)
    for folder in local:
        if not os.path.isdir(folder):
            raise UsageError(f"signature folder {folder} does not exist")
    return local


def catalog_for(args: argparse.Namespace) -> Catalog:
    """The shipped catalog plus the site-local folders (which override shipped ids)."""
    from denpex.catalog import CatalogError, load_catalog

    local = check_signature_dirs(args)
    try:
        return load_catalog(local=local)
    except CatalogError as exc:
        raise UsageError(str(exc)) from None


def describe_signature(sig: Signature) -> str:
    """A signature in full, as `denpex signatures show` and `denpex explain` print it."""
    lines = [
        f"{sig.id}  ({sig.category}, {sig.severity})",
        f"  summary   {sig.summary}",
        f"  action    {sig.action}",
        f"  explain   {sig.explain}",
        f"  regex     {sig.regex}" + ("   [ignorecase]" if "ignorecase" in sig.flags else ""),
        f"  sources   {', '.join(sig.sources) or 'any'}",
        f"  defined   {sig.file}:{sig.line}"
        + (f" (overrides the shipped entry in {sig.overrides})" if sig.overrides else ""),
    ]
    lines += [f"  refs      {ref}" for ref in sig.refs]
    lines += [f"  matches   {text}" for text in sig.examples_match]
    lines += [f"  ignores   {text}" for text in sig.examples_no_match]
    return "\n".join(lines)
