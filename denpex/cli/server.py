"""`denpex server`: the control plane (store, ingest, API, leader loops), and
`denpex server token` to mint a bearer token bound to one tenant and role."""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from denpex.cli.common import UsageError, db_option, db_url, open_store

DESCRIPTION = """\
Serve the control plane: OTLP/HTTP ingest (/v1/logs, /v1/metrics) for node agents, job
reports (POST /api/v1/reports) from `denpex run` and `denpex scan`, and the REST API under
/api/v1 (incidents, hosts, jobs, evidence; OpenAPI at /openapi.json). The store is one SQLite
file by default (zero set-up); with --db postgresql://… several replicas share one
database, and the correlation loop runs on one leader at a time. The schema is migrated at
start. Every request needs a bearer token from `denpex server token`.
"""

EPILOG = """\
examples:
  denpex server                                          # SQLite under the state dir, 127.0.0.1:9479
  denpex server --db sqlite:///var/lib/denpex/cp.db --listen 127.0.0.1:9479
  denpex server --db postgresql://denpex@db:5432/denpex --listen 0.0.0.0:9479
  denpex server token --db postgresql://denpex@db:5432/denpex --tenant research --role operator
  curl -H "Authorization: Bearer $T" http://cp:9479/api/v1/incidents
"""


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "server",
        help="run the control plane (fleet ingest, incidents, API)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    db_option(parser)
    parser.add_argument(
        "--listen", metavar="HOST:PORT", default="127.0.0.1:9479", help="address to serve on"
    )
    parser.add_argument(
        "--lease", metavar="S", type=float, default=10.0, help="leader lease in seconds"
    )
    parser.add_argument(
        "--retention-days", metavar="N", type=float, default=30.0, help="keep evidence N days"
    )
    parser.add_argument(
        "--max-evidence-rows",
        metavar="N",
        type=int,
        help="keep at most N evidence rows per tenant (the oldest go first)",
    )
    parser.add_argument(
        "--quota",
        metavar="RECORDS_PER_S",
        type=float,
        default=50_000.0,
        help="ingest quota per tenant and replica (429 beyond it)",
    )
    parser.add_argument(
        "--remediation-backend",
        choices=("slurm",),
        help="let the leader run remediation plans on this scheduler (default: plans are "
        "proposed and recorded, never run)",
    )
    parser.add_argument(
        "--diagnostics-command",
        metavar="CMD",
        help="the hardware diagnostics a plan runs ({host}, {level} filled in; default "
        "'dcgmi diag --host {host} -r {level}')",
    )
    parser.add_argument(
        "--topology",
        metavar="FILE",
        help="site topology (YAML/JSON: each host's rack, leaf switch, PDU, pool, GPU rails) "
        "for the fleet rules' shared-component incidents",
    )
    parser.add_argument(
        "--replay",
        action="store_true",
        help="replay recorded or simulated fleet history: no correlation loop of its own, an "
        "admin's POST /api/v1/replay/tick?now_ns=… runs each pass at the replayed time",
    )
    parser.set_defaults(handler=handle)
    sub = parser.add_subparsers(dest="server_command", metavar="SUBCOMMAND")
    token = sub.add_parser(
        "token",
        help="mint a bearer token (printed once, stored hashed)",
        description="Mint a bearer token bound to one tenant and one role; it is printed once.",
    )
    db_option(token)
    token.add_argument("--tenant", required=True, help="the tenant the token is bound to")
    token.add_argument(
        "--role", required=True, choices=("viewer", "operator", "admin"), help="what it may do"
    )
    token.add_argument("--note", default="", help="who or what the token is for")
    token.set_defaults(handler=handle_token)
    revoke = sub.add_parser("revoke", help="revoke a token by its id (dpx_<id>_…)")
    db_option(revoke)
    revoke.add_argument("token_id", help="the 16 hex digits after dpx_")
    revoke.set_defaults(handler=handle_revoke)


def handle(args: argparse.Namespace) -> int:
    from denpex.agent.config import parse_listen

    try:
        from denpex.control.db import StoreError
        from denpex.control.quotas import QuotaPolicy
        from denpex.control.retention import RetentionPolicy
        from denpex.control.server import ServerOptions, serve
    except ImportError as exc:
        raise UsageError(
            f"the server needs its extra dependencies ({exc.name}): pip install 'denpex[server]'"
        ) from None
    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    options = ServerOptions(
        url=db_url(args),
        host=host,
        port=port,
        lease_s=args.lease,
        retention=RetentionPolicy(
            max_age_days=args.retention_days, max_rows_per_tenant=args.max_evidence_rows
        ),
        quotas=QuotaPolicy(records_per_s=args.quota, burst=max(args.quota * 4, 1.0)),
        remediation_backend=args.remediation_backend,
        diagnostics_command=tuple(shlex.split(args.diagnostics_command))
        if args.diagnostics_command
        else None,
        topology=_topology(args.topology),
        replay=args.replay,
    )
    print(f"denpex server: {options.url.split('@')[-1]} on http://{host}:{port}", file=sys.stderr)
    try:
        return serve(options)
    except StoreError as exc:
        raise UsageError(str(exc)) from None


def _topology(path: str | None) -> dict:
    from denpex.control.fleet.topology import parse_topology

    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return parse_topology(f.read())
    except OSError as exc:
        raise UsageError(f"--topology {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"--topology {path}: {exc}") from None


def handle_token(args: argparse.Namespace) -> int:
    from denpex.enterprise import mint_token

    store = open_store(args)
    minted = mint_token()
    store.add_token(
        minted.token_id, args.tenant, args.role, minted.secret_hash, time.time_ns(), args.note
    )
    store.db.dispose()
    print(minted.token)
    print(
        f"denpex server token: {args.role} token {minted.token_id} for tenant {args.tenant!r}; "
        "it is shown only now",
        file=sys.stderr,
    )
    return 0


def handle_revoke(args: argparse.Namespace) -> int:
    store = open_store(args)
    done = store.revoke_token(args.token_id, time.time_ns())
    store.db.dispose()
    if not done:
        raise UsageError(f"no active token {args.token_id}")
    print(f"denpex server revoke: token {args.token_id} revoked", file=sys.stderr)
    return 0
