"""`denpex remediate plan|dry-run|approve|reject|status|spares`: remediation plans and the
warm-spare pool on the control plane, through its API (DENPEX_SERVER_URL and DENPEX_TOKEN or DENPEX_TOKEN_FILE, or --server
and --token). Thin: one request per command, the answer printed for a person (or --json).

It must never act on a backend itself: approving only lets the leader's executor run the step.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from denpex.cli.common import UsageError

HELP = """\
examples:
  export DENPEX_SERVER_URL=http://cp:9479 DENPEX_TOKEN=dpx_…
  denpex remediate dry-run 12          # what would happen to incident 12 under the policy
  denpex remediate plan 12             # the plans stored for incident 12
  denpex remediate status              # every plan; `status 3` shows plan 3 and its steps
  denpex remediate approve 3 --by alice
  denpex remediate reject 3 --by alice --note "node under maintenance"
  denpex remediate spares add n7 --pool gpu   # keep n7 as a warm spare (held, checked)
  denpex remediate spares list                # every spare, its state and last preflight
  denpex remediate spares remove n7           # give it back to service

exit status: 0 done, 1 refused by the server (not found, not allowed, nothing waits), 2 usage.
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "remediate",
        help="see, dry-run, approve or reject remediation plans on the control plane",
        description="Remediation plans on the control plane (DESIGN §7), through its API.",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--server", metavar="URL", help="default: DENPEX_SERVER_URL")
    parser.add_argument("--token", metavar="TOKEN", help="default: DENPEX_TOKEN(_FILE)")
    parser.add_argument("--json", action="store_true", help="print the server's JSON")
    sub = parser.add_subparsers(dest="remediate_command", metavar="ACTION", required=True)
    for name, text in (("plan", "the plans of an incident"), ("dry-run", "what would happen")):
        p = sub.add_parser(name, help=text)
        p.add_argument("incident", type=int, help="incident id")
        p.set_defaults(handler=handle)
    status = sub.add_parser("status", help="every plan, or one plan with its steps")
    status.add_argument("plan", type=int, nargs="?", help="plan id")
    status.add_argument("--state", dest="status", help="only plans with this status")
    status.set_defaults(handler=handle)
    for name in ("approve", "reject"):
        p = sub.add_parser(name, help=f"{name} the step a plan waits at (approver or admin role)")
        p.add_argument("plan", type=int, help="plan id")
        p.add_argument("--by", default=None, help="the human deciding (default: your user)")
        if name == "reject":
            p.add_argument("--note", default="", help="why")
        p.set_defaults(handler=handle)
    spares = sub.add_parser("spares", help="the warm-spare pool: list, add or remove a host")
    verbs = spares.add_subparsers(dest="spares_command", metavar="VERB", required=True)
    verbs.add_parser("list", help="every spare, its state and last preflight").set_defaults(
        handler=handle
    )
    add = verbs.add_parser("add", help="keep a host as a warm spare (approver or admin role)")
    add.add_argument("host", help="the node name as the scheduler knows it")
    add.add_argument("--pool", default=None, help="the pool it stands in for (default: any)")
    remove = verbs.add_parser("remove", help="give a spare back to service")
    remove.add_argument("host")
    for p in (add, remove):
        p.add_argument("--by", default=None, help="the human asking (default: your user)")
        p.set_defaults(handler=handle)


def _connection(args: argparse.Namespace) -> tuple[str, str]:
    url = args.server or os.environ.get("DENPEX_SERVER_URL")
    if not url:
        raise UsageError("no server: give --server URL or set DENPEX_SERVER_URL")
    token = args.token or os.environ.get("DENPEX_TOKEN")
    if not token and os.environ.get("DENPEX_TOKEN_FILE"):
        try:
            token = Path(os.environ["DENPEX_TOKEN_FILE"]).read_text().strip()
        except OSError as exc:
            raise UsageError(f"cannot read DENPEX_TOKEN_FILE: {exc.strerror}") from None
    if not token:
        raise UsageError("no token: give --token or set DENPEX_TOKEN (from denpex server token)")
    return url.rstrip("/"), token


def _request(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    import urllib.error
    import urllib.request  # here, not at the top: `denpex run` builds this parser too

    from denpex.core import jsonio

    url, token = _connection(args)
    data = None if body is None else jsonio.dumps(body)
    request = urllib.request.Request(
        url + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return jsonio.loads(reply.read())
    except urllib.error.HTTPError as err:
        try:
            detail = jsonio.loads(err.read()).get("error") or err.reason
        except ValueError:
            detail = err.reason
        raise _Refused(f"{err.code} {detail}") from None
    except (urllib.error.URLError, OSError) as err:
        raise UsageError(f"cannot reach {url}: {getattr(err, 'reason', err)}") from None


class _Refused(Exception):
    pass


def handle(args: argparse.Namespace) -> int:
    import getpass

    command = args.remediate_command
    by = getattr(args, "by", None) or getpass.getuser()
    base = "/api/v1/remediation"
    try:
        if command == "plan":
            data = _request(args, "GET", f"{base}/plans?incident={args.incident}")
        elif command == "dry-run":
            data = _request(args, "GET", f"{base}/dry-run/{args.incident}")
        elif command == "status" and args.plan:
            data = _request(args, "GET", f"{base}/plans/{args.plan}")
        elif command == "status":
            query = f"?status={args.status}" if args.status else ""
            data = _request(args, "GET", f"{base}/plans{query}")
        elif command == "spares":
            data = _spares(args, by)
        elif command == "approve":
            data = _request(args, "POST", f"{base}/plans/{args.plan}/approve", {"by": by})
        else:
            body = {"by": by, "note": args.note}
            data = _request(args, "POST", f"{base}/plans/{args.plan}/reject", body)
    except _Refused as exc:
        print(f"denpex remediate {command}: refused: {exc}", file=sys.stderr)
        return 1
    if args.json:
        from denpex.core import jsonio

        sys.stdout.write(jsonio.dumps(data, pretty=True).decode() + "\n")
    elif command == "dry-run":
        print(_dry_run_text(data))
    elif command == "spares":
        print(_spares_text(data.get("items", [data])))
    elif "items" in data:
        print(_plans_text(data["items"]))
    else:
        print(_plan_text(data))
    return 0


def _spares(args: argparse.Namespace, by: str) -> Any:
    from urllib.parse import quote, urlencode

    base = "/api/v1/remediation/spares"
    if args.spares_command == "list":
        return _request(args, "GET", base)
    if args.spares_command == "add":
        return _request(args, "POST", base, {"host": args.host, "pool": args.pool, "by": by})
    return _request(args, "DELETE", f"{base}/{quote(args.host, safe='')}?{urlencode({'by': by})}")


def _spares_text(items: list[dict[str, Any]]) -> str:
    if not items:
        return "no warm spares"
    rows = [f"{'HOST':<16} {'POOL':<10} {'STATUS':<10} {'PREFLIGHT':<10} NOTE"]
    for sp in items:
        passed = (sp.get("preflight") or {}).get("passed")
        verdict = "-" if passed is None else ("passed" if passed else "failed")
        failed = [c["check"] for c in sp.get("results") or [] if not c.get("passed")]
        note = sp.get("note") or ""
        if failed:
            note += f" (failed: {', '.join(failed)})"
        rows.append(
            f"{sp['host']:<16} {sp.get('pool') or '-':<10} {sp['status']:<10} {verdict:<10} {note}"
        )
    return "\n".join(rows)


def _plans_text(items: list[dict[str, Any]]) -> str:
    if not items:
        return "no plans"
    rows = [f"{'PLAN':>5}  {'INCIDENT':>8}  {'HOST':<12} {'TIER':<13} {'STATUS':<11} STEP"]
    for p in items:
        rows.append(
            f"{p['id']:>5}  {p['incident']:>8}  {p['host']:<12} {p['tier']:<13} "
            f"{p['status']:<11} {p['state']}" + (f"  ({p['note']})" if p.get("note") else "")
        )
    return "\n".join(rows)


def _plan_text(p: dict[str, Any]) -> str:
    lines = [
        f"plan {p['id']} for incident {p['incident']} on {p['host']} (pool {p['pool'] or '-'})",
        f"  tier {p['tier']}, status {p['status']}, at step {p['state']}",
        f"  steps: {' -> '.join(p['plan']['steps'])}",
    ]
    if p.get("note"):
        lines.append(f"  note: {p['note']}")
    if p.get("decided_by"):
        lines.append(f"  last decided by {p['decided_by']}")
    for s in p.get("steps") or []:
        if s["phase"] == "finished":
            detail = s["result"].get("detail") or s["result"].get("error") or ""
            lines.append(f"  {s['seq']:>3} {s['state']:<12} {s['event']:<8} {detail}")
    return "\n".join(lines)


def _dry_run_text(data: dict[str, Any]) -> str:
    if not data["plans"]:
        return f"incident {data['incident']}: nothing for a scheduler to do (record only)"
    lines = []
    for p in data["plans"]:
        target = p["target"]
        lines.append(
            f"incident {p['incident']} ({p['category']}) on {target['host']}: tier {p['tier']}, "
            f"would be {p['status']}" + (f" — {p['note']}" if p.get("note") else "")
        )
        for step in p["would"]:
            lines.append(f"  {step['step']:<12} {step['decision']:<7} {step['explain']}")
    return "\n".join(lines)
