"""`denpex server`: the control plane (store, ingest, API, leader loops), and
`denpex server token` to mint a bearer token bound to one tenant and role."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

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
  denpex server --objects 's3://denpex/cp?endpoint=http://127.0.0.1:7480&sse=AES256'
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
        "--policies",
        metavar="DIR",
        help="the Cedar policy folder that decides every request (default: the bundled set; "
        "check one first with `denpex policy test --policies DIR CASES`)",
    )
    parser.add_argument(
        "--oidc",
        metavar="FILE",
        help="also accept OIDC tokens (ID tokens, JWT access tokens) of the provider this YAML "
        "names, with its group → tenant/role mappings (also: DENPEX_OIDC_CONFIG)",
    )
    parser.add_argument(
        "--saml",
        metavar="FILE",
        help="also sign people in to the web UI through the SAML 2.0 IdP this YAML names, "
        "with its group → tenant/role mappings (also: DENPEX_SAML_CONFIG)",
    )
    parser.add_argument(
        "--remediation-backend",
        choices=("slurm", "kubernetes", "webhook"),
        help="let the leader run remediation plans on this scheduler or cluster (default: plans are "
        "proposed and recorded, never run)",
    )
    parser.add_argument(
        "--remediation-webhook-url",
        metavar="URL",
        help="with --remediation-backend webhook: POST each plan step here, signed with the "
        "secret in DENPEX_REMEDIATION_WEBHOOK_SECRET",
    )
    parser.add_argument(
        "--notify",
        metavar="FILE",
        help="remediation notices to these channels (YAML: channels: NAME: {type: slack|"
        "pagerduty|webhook|jira|rma_webhook, url, secret_env, routing_key_env, kinds})",
    )
    parser.add_argument(
        "--spare-checks",
        metavar="FILE",
        help="the warm spares' preflight (YAML: checks: [{name, command: [argv with {host} and "
        "{spares}], explain}]; default: the packaged spares.yaml's DCGM, all-reduce, IB checks)",
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
    parser.add_argument(
        "--jetstream",
        metavar="URLS",
        help="also ingest evidence from the NATS JetStream stream at these comma-separated "
        "nats:// URLs (agents with server.jetstream publish there); every replica pulls from "
        "one durable consumer; the stream is created when missing",
    )
    parser.add_argument(
        "--jetstream-replicas",
        metavar="N",
        type=int,
        default=3,
        help="replicas of the ingest stream when this server creates it (default 3)",
    )
    parser.add_argument(
        "--region",
        metavar="NAME",
        help="be the authority for this region's hosts (needs --regions): a tenant not resident "
        "here, or a host of another region, is refused at ingest and audited; in PostgreSQL "
        "the region's incidents and audit log are published for the global read view",
    )
    parser.add_argument(
        "--regions",
        metavar="FILE",
        help="the regions file (YAML): each region's host patterns, each tenant's residency, "
        "where the global view is (see denpex/control/residency.py)",
    )
    _kms_option(parser)
    parser.add_argument(
        "--objects",
        metavar="URL",
        help="where report archives, incident evidence bundles and RMA attachments are kept: "
        "file:///PATH (default: a folder under the state dir) or s3://BUCKET[/PREFIX]?endpoint="
        "URL&region=R&sse=AES256|aws:kms&checksum=sha256|md5&create=1 (any S3-compatible "
        "endpoint; credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) (also: "
        "DENPEX_OBJECTS)",
    )
    parser.add_argument(
        "--credentials",
        metavar="SOURCE",
        default=os.environ.get("DENPEX_CREDENTIALS"),
        help="a Kubernetes secret holding the server's own credentials (keys db-url, "
        "db-password, oidc-client-secret, bao-token, aws-access-key-id, "
        "aws-secret-access-key): k8s-volume:///PATH (mounted; re-read on rotation) or "
        "k8s-secret://NAMESPACE/NAME (the API) (also: DENPEX_CREDENTIALS)",
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
        "--role",
        required=True,
        help="what it may do: a role of the policy set (bundled: "
        f"{', '.join(_bundled_roles())}; `denpex policy show` explains them)",
    )
    token.add_argument("--note", default="", help="who or what the token is for")
    token.add_argument(
        "--owner",
        help="the person the token stands for (scim:<SCIM user id>, or a name): their second "
        "factor guards its UI sign-ins, and SCIM deprovisioning revokes it",
    )
    token.add_argument(
        "--policies", metavar="DIR", help="the policy folder whose roles --role names"
    )
    token.set_defaults(handler=handle_token)
    revoke = sub.add_parser("revoke", help="revoke a token by its id (dpx_<id>_…)")
    db_option(revoke)
    revoke.add_argument("token_id", help="the 16 hex digits after dpx_")
    revoke.set_defaults(handler=handle_revoke)
    rotate = sub.add_parser(
        "rotate-key",
        help="rotate the KMS key of stored secrets and re-wrap them (servers keep serving)",
    )
    db_option(rotate)
    _kms_option(rotate)
    rotate.set_defaults(handler=handle_rotate)
    view = sub.add_parser(
        "global-view",
        help="set up or read the global read view (incidents and audit of every region)",
        description="On the global site's PostgreSQL (as a superuser): create the global "
        "tables and subscribe to each region's publication; or list what has arrived.",
    )
    db_option(view)
    view.add_argument(
        "--subscribe",
        metavar="REGION=CONNINFO",
        action="append",
        default=[],
        help="subscribe to a region's server database (a role with REPLICATION there)",
    )
    view.add_argument("--list", choices=("incidents", "audit", "status"), help="print as JSON")
    view.add_argument("--tenant", help="with --list: only this tenant's rows")
    view.set_defaults(handler=handle_global_view)


def _bundled_roles() -> tuple[str, ...]:
    from denpex.enterprise import bundled_roles

    return bundled_roles()


def _kms_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kms",
        metavar="URL",
        help="the KMS that seals stored secrets: file:///PATH (default: a key file under the "
        "state dir), openbao+http://HOST:8200/KEY (BAO_TOKEN), aws:///ALIAS, "
        "pkcs11:token=T;object=K?module-path=LIB&pin-source=FILE (an HSM) (also: DENPEX_KMS)",
    )


def handle(args: argparse.Namespace) -> int:
    from denpex.agent.config import parse_listen

    try:
        from denpex.control.db import StoreError
        from denpex.control.objects import ObjectError
        from denpex.control.quotas import QuotaPolicy
        from denpex.control.retention import RetentionPolicy
        from denpex.control.server import ServerOptions, serve
        from denpex.enterprise import PolicyError
        from denpex.enterprise.credentials import CredentialError
    except ImportError as exc:
        raise UsageError(
            f"the server needs its extra dependencies ({exc.name}): pip install 'denpex[server]'"
        ) from None
    try:
        host, port = parse_listen(args.listen)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    options = ServerOptions(
        url=_server_db_url(args),
        host=host,
        port=port,
        lease_s=args.lease,
        retention=RetentionPolicy(
            max_age_days=args.retention_days, max_rows_per_tenant=args.max_evidence_rows
        ),
        quotas=QuotaPolicy(records_per_s=args.quota, burst=max(args.quota * 4, 1.0)),
        policy_dir=args.policies,
        oidc=_oidc(args),
        saml=_saml(args),
        kms_url=args.kms,
        objects_url=args.objects,
        remediation_backend=args.remediation_backend,
        remediation_webhook_url=args.remediation_webhook_url,
        notify_channels=_notify(args.notify),
        spare_checks=_spare_checks(args.spare_checks),
        diagnostics_command=tuple(shlex.split(args.diagnostics_command))
        if args.diagnostics_command
        else None,
        topology=_topology(args.topology),
        replay=args.replay,
        jetstream=_jetstream(args.jetstream),
        jetstream_replicas=args.jetstream_replicas,
        residency=_residency(args.region, args.regions),
        credentials=args.credentials,
    )
    print(f"denpex server: {options.url.split('@')[-1]} on http://{host}:{port}", file=sys.stderr)
    if args.credentials:
        _say_credentials(args.credentials)
    try:
        return serve(options)
    except (StoreError, PolicyError, ObjectError, CredentialError) as exc:
        raise UsageError(str(exc)) from None


def _say_credentials(spec: str) -> None:
    """Which secret the server's own credentials come from, and its keys (never a value)."""
    from denpex.enterprise.credentials import CredentialError, open_source

    try:
        source = open_source(spec)
        keys = ", ".join(source.keys()) or "none"
    except CredentialError as exc:
        raise UsageError(f"--credentials: {exc}") from None
    print(f"denpex server: credentials from {source.describe()} (keys: {keys})", file=sys.stderr)


def _server_db_url(args: argparse.Namespace) -> str:
    """--db, DENPEX_SERVER_DB, else the credentials secret's db-url, else the default."""
    if args.db or os.environ.get("DENPEX_SERVER_DB") or not args.credentials:
        return db_url(args)
    from denpex.enterprise.credentials import DB_URL, CredentialError, open_source

    try:
        found = open_source(args.credentials).get(DB_URL)
    except CredentialError as exc:
        raise UsageError(f"--credentials: {exc}") from None
    return found or db_url(args)


def _residency(region: str | None, path: str | None):
    from denpex.control.residency import load_residency

    if region is None and path is None:
        return None
    if region is None or path is None:
        raise UsageError("--region and --regions go together")
    try:
        return load_residency(region, path)
    except OSError as exc:
        raise UsageError(f"--regions {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"--regions {path}: {exc}") from None


def handle_global_view(args: argparse.Namespace) -> int:
    import json

    from denpex.control.global_view import GlobalView

    try:
        view = GlobalView(db_url(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        view.prepare()
        for item in args.subscribe:
            region, sep, conninfo = item.partition("=")
            if not sep or not conninfo:
                raise UsageError(f"--subscribe {item!r}: REGION=CONNINFO")
            view.subscribe(region, conninfo)
            print(f"denpex server global-view: subscribed to region {region}", file=sys.stderr)
        if args.list == "status":
            print(json.dumps(view.status(), default=str, indent=2))
        elif args.list is not None:
            rows = getattr(view, args.list)(tenant=args.tenant, limit=1000)
            print(json.dumps(rows, default=str, indent=2))
    finally:
        view.dispose()
    return 0


def _jetstream(value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    urls = tuple(u.strip() for u in value.split(",") if u.strip())
    if not all(u.startswith(("nats://", "tls://")) for u in urls):
        raise UsageError(f"--jetstream {value!r}: comma-separated nats:// URLs")
    try:
        import nats  # noqa: F401
    except ImportError:
        raise UsageError("--jetstream needs nats-py: pip install 'denpex[server]'") from None
    return urls


def _oidc(args: argparse.Namespace):
    import os

    from denpex.enterprise import OidcConfig, OidcConfigError

    path = args.oidc or os.environ.get("DENPEX_OIDC_CONFIG")
    if not path:
        return None
    try:
        return OidcConfig.load(path)
    except OidcConfigError as exc:
        raise UsageError(str(exc)) from None


def _saml(args: argparse.Namespace):
    import os

    from denpex.enterprise.saml import SamlConfig, SamlConfigError

    path = args.saml or os.environ.get("DENPEX_SAML_CONFIG")
    if not path:
        return None
    try:
        return SamlConfig.load(path)
    except SamlConfigError as exc:
        raise UsageError(str(exc)) from None


def _notify(path: str | None) -> tuple[Any, ...]:
    if not path:
        return ()
    import yaml

    from denpex.remediation.notify import load_channels

    try:
        return tuple(load_channels(yaml.safe_load(Path(path).read_text()) or {}))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise UsageError(f"--notify {path}: {exc}") from None


def _spare_checks(path: str | None) -> tuple[Any, ...] | None:
    if not path:
        return None
    import yaml

    from denpex.remediation.spares import checks_from

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
        checks = checks_from(data["checks"])
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise UsageError(
            f"--spare-checks {path}: {exc!r} (want checks: [{{name, command}}])"
        ) from None
    if not checks:
        raise UsageError(f"--spare-checks {path}: no checks (a spare would pass unchecked)")
    return checks


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
    from denpex.enterprise import PolicyError, load_policies, mint_token

    try:
        roles = tuple(load_policies(args.policies).roles)
    except PolicyError as exc:
        raise UsageError(str(exc)) from None
    if args.role not in roles:
        raise UsageError(f"--role {args.role!r}: invalid choice (choose from {', '.join(roles)})")
    store = open_store(args)
    minted = mint_token()
    store.add_token(
        minted.token_id,
        args.tenant,
        args.role,
        minted.secret_hash,
        time.time_ns(),
        args.note,
        owner=args.owner or None,
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


def handle_rotate(args: argparse.Namespace) -> int:
    from denpex.control.secrets import SecretStore
    from denpex.control.sensitive import SensitiveEvidence
    from denpex.control.server import kms_url
    from denpex.enterprise import KmsError, open_kms

    store = open_store(args)
    secrets = SecretStore(store.db, lambda: open_kms(kms_url(args.kms)))
    sensitive = SensitiveEvidence(store.db, lambda: secrets.kms)
    try:
        tenants = store.tenants()
        done = secrets.rotate_and_rewrap(tenants, time.time_ns())
        keys = sensitive.rewrap(tenants, time.time_ns())  # under the key just rotated to
    except KmsError as exc:
        raise UsageError(str(exc)) from None
    finally:
        store.db.dispose()
    print(
        f"denpex server rotate-key: rotated; {done} secrets and {keys} tenant evidence key(s) "
        "re-wrapped",
        file=sys.stderr,
    )
    return 0
