"""`denpex compliance report`: the compliance matrix (controls → features → tests) with
each test's last result from a junit XML, as Markdown or JSON."""

from __future__ import annotations

import argparse
import os
import sys

from denpex.cli.common import UsageError

DEFAULT_JUNIT = "build/test-results/junit.xml"  # where scripts/test-all.sh writes it

DESCRIPTION = f"""\
Print which SOC 2, ISO 27001 Annex A, HIPAA §164.312 and NIST 800-53 controls denpex
addresses, with which features, and the last result of each test that proves them, read
from a junit XML (--junit FILE, DENPEX_JUNIT, else {DEFAULT_JUNIT} as scripts/test-all.sh
writes it). Without results every test says "not run": nothing is reported as proven
without a passing test.
"""


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "compliance",
        help="the compliance matrix with each control's tests and their last result",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="compliance_command", metavar="ACTION", required=True)
    report = actions.add_parser("report", help="print the matrix (Markdown, or --json)")
    report.add_argument("--json", action="store_true", help="JSON instead of Markdown")
    report.add_argument("--junit", metavar="FILE", help="the junit XML of the last test run")
    report.add_argument("--mapping", metavar="FILE", help="another mapping file (YAML)")
    report.set_defaults(handler=handle_report)


def handle_report(args: argparse.Namespace) -> int:
    import json
    import xml.etree.ElementTree as ET

    from denpex.enterprise.compliance import junit_results, load_mapping, markdown, matrix

    try:
        _features, controls = load_mapping(args.mapping)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"the compliance mapping cannot be read: {exc}") from None
    junit = args.junit or os.environ.get("DENPEX_JUNIT") or DEFAULT_JUNIT
    results = None
    source = f"none ({junit} not found)"
    if os.path.exists(junit):
        try:
            results = junit_results(junit)
        except (ET.ParseError, OSError) as exc:
            raise UsageError(f"{junit}: not a junit XML ({exc})") from None
        source = junit
    elif args.junit:
        raise UsageError(f"{junit}: no such file")
    rows = matrix(controls, results)
    if args.json:
        print(json.dumps({"results": source, "controls": rows}, indent=2))
    else:
        sys.stdout.write(markdown(rows, source))
    return 0
