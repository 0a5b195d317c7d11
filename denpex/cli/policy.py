"""`denpex policy test|show`: check an authorisation policy set (Cedar) against cases
before a server uses it, and list what a set contains."""

from __future__ import annotations

import argparse
import sys

from denpex.cli.common import UsageError

DESCRIPTION = """\
The control plane decides every request with a Cedar policy set: the bundled one, or the
folder given to `denpex server --policies DIR` (manifest.yaml, a schema, .cedar files; see
denpex/enterprise/policies/README.md). `test` runs a YAML file of cases (principal, action,
resource, context → allow|deny) and exits 1 when any decision differs.
"""
EPILOG = """\
examples:
  denpex policy show
  denpex policy test cases.yaml
  denpex policy test --policies /etc/denpex/policies cases.yaml
"""


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "policy",
        help="test and show the authorisation policies (Cedar)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    test = actions.add_parser("test", help="run a YAML file of cases; exit 1 on a mismatch")
    test.add_argument("cases", metavar="FILE", help="YAML with a `cases:` list")
    show = actions.add_parser("show", help="the set's version, roles, actions and policies")
    for sub in (test, show):
        sub.add_argument(
            "--policies", metavar="DIR", help="a policy folder (default: the bundled set)"
        )
    test.set_defaults(handler=handle_test)
    show.set_defaults(handler=handle_show)


def _policies(args: argparse.Namespace):
    from denpex.enterprise import PolicyError, load_policies

    try:
        return load_policies(args.policies)
    except PolicyError as exc:
        raise UsageError(str(exc)) from None


def handle_test(args: argparse.Namespace) -> int:
    from denpex.enterprise import PolicyError
    from denpex.enterprise.policy_cases import load_cases, run_cases

    policies = _policies(args)
    try:
        cases = load_cases(args.cases)
    except PolicyError as exc:
        raise UsageError(str(exc)) from None
    outcomes = run_cases(cases, policies)
    failed = [o for o in outcomes if not o.passed]
    for outcome in failed:
        print(f"FAIL {outcome.describe()}", file=sys.stderr)
    print(
        f"denpex policy test: {len(outcomes) - len(failed)} passed, {len(failed)} failed "
        f"(policy set {policies.source}, version {policies.version})"
    )
    return 1 if failed else 0


def handle_show(args: argparse.Namespace) -> int:
    policies = _policies(args)
    print(f"policy set {policies.source}, version {policies.version}")
    print("roles:")
    for role, parents in policies.roles.items():
        extends = f" (extends {', '.join(parents)})" if parents else ""
        print(f"  {role}{extends}: {policies.explain.get(role, '')}")
    print("actions:")
    for action in policies.actions:
        print(f"  {action}: {policies.explain.get(action, '')}")
    print("policies:")
    for policy_id in policies.policy_ids:
        print(f"  {policy_id}")
    return 0
