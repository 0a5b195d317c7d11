"""Options shared by `denpex run` and `denpex scan`: reports and the signature catalog."""

from __future__ import annotations

import argparse
import os

from denpex.catalog import Catalog, CatalogError, load_catalog
from denpex.catalog.loader import builtin_catalog_files
from denpex.cli.main import UsageError
from denpex.lite.session import ReportOptions


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
        help="also load the signature files (*.yaml) under DIR; may repeat",
    )


def report_options(args: argparse.Namespace, *, json_stdout: bool = False) -> ReportOptions:
    for path in (args.report, args.html):
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder):
                raise UsageError(f"cannot write {path}: folder {folder} does not exist")
    return ReportOptions(
        report_path=args.report,
        html_path=args.html,
        json_stdout=json_stdout,
        text=not args.quiet,
        color=args.color,
    )


def catalog_for(args: argparse.Namespace) -> Catalog:
    extra = list(args.signatures)
    env = os.environ.get("DENPEX_SIGNATURES")
    if env:
        extra.extend(p for p in env.split(os.pathsep) if p)
    for folder in extra:
        if not os.path.exists(folder):
            raise UsageError(f"signature folder {folder} does not exist")
    try:
        if not extra:
            return load_catalog()
        return load_catalog([*map(str, builtin_catalog_files()), *extra])
    except CatalogError as exc:
        raise UsageError(str(exc)) from None
