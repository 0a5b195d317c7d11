"""The store's API: `Store` holds the database; tenant data is reached only through a
TenantStore, obtained from an authenticated Principal (`Store.scoped`) or, for the leader's
loops, for one named tenant behind the epoch fence (`Store.for_leader`).

Every query of a TenantStore filters by its tenant, and runs in a transaction bound to that
tenant (PostgreSQL's row-level security filters again). Each write is one transaction: a
failure stores nothing. It must never build SQL from request text (parameters only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection

from denpex.control import audit_log
from denpex.control import schema as s
from denpex.control.db import Database
from denpex.control.ingest import LogBatch, Report
from denpex.control.sensitive import WITHHELD
from denpex.control.timefmt import iso
from denpex.core import jsonio
from denpex.enterprise import Principal, TokenRecord, envelope, is_authentic

_EVIDENCE_COLUMNS = [c.name for c in s.evidence.columns]
HISTORY_LINKS = 20  # incidents and jobs shown in a host's history


class Fenced(RuntimeError):
    """A leader's write refused: another replica holds a newer epoch."""


class NotFound(LookupError):
    pass


class Conflict(RuntimeError):
    """A lifecycle step that does not apply (resolving a resolved incident)."""


@dataclass(frozen=True, slots=True)
class Fence:
    name: str
    epoch: int


@dataclass(frozen=True, slots=True)
class Page:
    items: list[dict[str, Any]]
    next_cursor: str | None


class RowSealer(Protocol):
    """Seals the sensitive evidence bodies of a tenant's rows (denpex.control.sensitive)."""

    def seal_rows(self, tenant: str, rows: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]: ...


class Store:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.sealer: RowSealer | None = None  # the server sets it; None: bodies as they come
        params = ", ".join(["?" if not db.postgres else "%s"] * len(_EVIDENCE_COLUMNS))
        columns = ", ".join(_EVIDENCE_COLUMNS)
        if db.postgres:
            self._insert_evidence = (
                f"INSERT INTO evidence ({columns}) VALUES ({params}) ON CONFLICT DO NOTHING"
            )
            self._upsert_host = (
                "INSERT INTO hosts (tenant, name, first_ns, last_ns) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (tenant, name) DO UPDATE SET "
                "first_ns = LEAST(hosts.first_ns, excluded.first_ns), "
                "last_ns = GREATEST(hosts.last_ns, excluded.last_ns)"
            )
            self._upsert_metric = (
                "INSERT INTO host_metrics (tenant, host, name, labels, ts_ns, value) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (tenant, host, name, labels) "
                "DO UPDATE SET ts_ns = excluded.ts_ns, value = excluded.value "
                "WHERE excluded.ts_ns >= host_metrics.ts_ns"
            )
        else:
            self._insert_evidence = f"INSERT OR IGNORE INTO evidence ({columns}) VALUES ({params})"
            self._upsert_host = (
                "INSERT INTO hosts (tenant, name, first_ns, last_ns) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (tenant, name) DO UPDATE SET "
                "first_ns = min(first_ns, excluded.first_ns), "
                "last_ns = max(last_ns, excluded.last_ns)"
            )
            self._upsert_metric = (
                "INSERT INTO host_metrics (tenant, host, name, labels, ts_ns, value) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, host, name, labels) "
                "DO UPDATE SET ts_ns = excluded.ts_ns, value = excluded.value "
                "WHERE excluded.ts_ns >= host_metrics.ts_ns"
            )

    # --- handles -------------------------------------------------------------------------

    def scoped(self, principal: Principal) -> TenantStore:
        """The tenant store of an authenticated principal (and of no one else)."""
        if not is_authentic(principal):
            raise PermissionError("a tenant store needs a Principal from denpex.enterprise")
        return TenantStore(self, principal.tenant, None)

    def for_leader(self, tenant: str, fence: Fence) -> TenantStore:
        """The leader loop's handle on one tenant: every write first checks `fence`."""
        return TenantStore(self, tenant, fence)

    # --- tables without a tenant ---------------------------------------------------------

    def find_token(self, token_id: str) -> TokenRecord | None:
        with self.db.system_tx() as conn:
            row = conn.execute(sa.select(s.tokens).where(s.tokens.c.token_id == token_id)).first()
        if row is None:
            return None
        return TokenRecord(
            row.token_id,
            row.tenant,
            row.role,
            row.secret_hash,
            row.revoked_ns is not None,
            row.owner,
            row.expires_ns,
        )

    def add_token(
        self,
        token_id: str,
        tenant: str,
        role: str,
        secret_hash: str,
        now_ns: int,
        note: str = "",
        *,
        owner: str | None = None,
        expires_ns: int | None = None,
        actor: str = "admin",
    ) -> None:
        with self.db.system_tx(write=True) as conn:
            self._ensure_tenant(conn, tenant, now_ns)
            conn.execute(
                s.tokens.insert().values(
                    token_id=token_id,
                    tenant=tenant,
                    role=role,
                    secret_hash=secret_hash,
                    created_ns=now_ns,
                    note=note,
                    owner=owner,
                    expires_ns=expires_ns,
                )
            )
            result: dict[str, Any] = {"role": role, "note": note}
            if owner is not None:
                result.update(owner=owner, expires_ns=expires_ns)
            audit_log.append(
                conn,
                ts_ns=now_ns,
                kind="token.created",
                actor=actor,
                tenant=tenant,
                subject=f"token {token_id}",
                result=result,
            )

    def revoke_owned(self, tenant: str, owners: list[str], now_ns: int, actor: str) -> int:
        """Revoke every live token of `tenant` standing for one of `owners` (sessions and
        tokens of a deprovisioned person), each revocation in the audit; returns how many."""
        t = s.tokens
        with self.db.system_tx(write=True) as conn:
            ids = list(
                conn.execute(
                    sa.select(t.c.token_id).where(
                        t.c.tenant == tenant, t.c.owner.in_(owners), t.c.revoked_ns.is_(None)
                    )
                ).scalars()
            )
            for token_id in ids:
                conn.execute(t.update().where(t.c.token_id == token_id).values(revoked_ns=now_ns))
                audit_log.append(
                    conn,
                    ts_ns=now_ns,
                    kind="token.revoked",
                    actor=actor,
                    tenant=tenant,
                    subject=f"token {token_id}",
                )
        return len(ids)

    def set_owned_role(self, tenant: str, owners: list[str], role: str) -> int:
        """Give the live tokens standing for `owners` the role `role` (the caller records the
        role change); returns how many."""
        t = s.tokens
        with self.db.system_tx(write=True) as conn:
            return int(
                conn.execute(
                    t.update()
                    .where(t.c.tenant == tenant, t.c.owner.in_(owners), t.c.revoked_ns.is_(None))
                    .values(role=role)
                ).rowcount
            )

    def revoke_token(self, token_id: str, now_ns: int, actor: str = "admin") -> bool:
        with self.db.system_tx(write=True) as conn:
            result = conn.execute(
                s.tokens.update()
                .where(s.tokens.c.token_id == token_id, s.tokens.c.revoked_ns.is_(None))
                .values(revoked_ns=now_ns)
            )
            if result.rowcount:
                tenant = conn.execute(
                    sa.select(s.tokens.c.tenant).where(s.tokens.c.token_id == token_id)
                ).scalar()
                audit_log.append(
                    conn,
                    ts_ns=now_ns,
                    kind="token.revoked",
                    actor=actor,
                    tenant=tenant,
                    subject=f"token {token_id}",
                )
            return bool(result.rowcount)

    def _ensure_tenant(self, conn: Connection, tenant: str, now_ns: int) -> None:
        exists = conn.execute(sa.select(s.tenants.c.name).where(s.tenants.c.name == tenant)).first()
        if exists is None:
            conn.execute(s.tenants.insert().values(name=tenant, created_ns=now_ns))

    def server_secret(self, name: str, make: Callable[[], str], now_ns: int) -> str:
        """The secret `name` every replica shares, created with `make()` by whichever replica
        asks first (the others read the row it wrote)."""
        t = s.server_secrets
        with self.db.system_tx(write=True) as conn:
            found = conn.execute(sa.select(t.c.value).where(t.c.name == name)).scalar()
            if found is None:
                insert = (pg_insert if self.db.postgres else sqlite_insert)(t)
                conn.execute(
                    insert.values(
                        name=name, value=make(), created_ns=now_ns
                    ).on_conflict_do_nothing()
                )
                found = conn.execute(sa.select(t.c.value).where(t.c.name == name)).scalar_one()
        return str(found)

    def tenants(self) -> list[str]:
        with self.db.system_tx() as conn:
            return list(conn.execute(sa.select(s.tenants.c.name).order_by("name")).scalars())


class TenantStore:
    """Everything one tenant's requests (or the leader, for that tenant) can read or write."""

    def __init__(self, store: Store, tenant: str, fence: Fence | None) -> None:
        self._store = store
        self._db = store.db
        self.tenant = tenant
        self._fence = fence

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        fence, postgres = self._fence, self._db.postgres
        prelude = None if fence is None else lambda c: check_fence(c, fence, postgres=postgres)
        with self._db.tenant_tx(self.tenant, write=True, prelude=prelude) as conn:
            yield conn

    def _read(self) -> Any:
        return self._db.tenant_tx(self.tenant)

    # --- ingest ----------------------------------------------------------------------------

    def _sealed(self, batch: LogBatch) -> LogBatch:
        """The batch with its sensitive bodies sealed (denpex.control.sensitive), before any
        write transaction opens (making the tenant's data key takes one of its own)."""
        sealer = self._store.sealer
        if sealer is None or not batch.rows:
            return batch
        return LogBatch(sealer.seal_rows(self.tenant, batch.rows), batch.hosts)

    def add_evidence(self, batch: LogBatch) -> int:
        """Store a batch in one transaction; returns how many rows were new (the others were
        already stored under their event id: a redelivery)."""
        batch = self._sealed(batch)
        with self._write() as conn:
            return self._insert_batch(conn, batch)

    def _insert_batch(self, conn: Connection, batch: LogBatch) -> int:
        for row in batch.rows:
            if row[0] != self.tenant:
                raise PermissionError("a row of another tenant in this tenant's batch")
        inserted = 0
        if batch.rows:
            inserted = conn.exec_driver_sql(self._store._insert_evidence, batch.rows).rowcount
        if batch.hosts:
            conn.exec_driver_sql(
                self._store._upsert_host,
                [(self.tenant, h, first, last) for h, (first, last) in sorted(batch.hosts.items())],
            )
        return int(inserted)

    def add_metrics(self, rows: Sequence[tuple[Any, ...]]) -> int:
        latest: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for row in rows:
            if row[0] != self.tenant:
                raise PermissionError("a row of another tenant in this tenant's batch")
            key = row[:4]
            if key not in latest or latest[key][4] <= row[4]:
                latest[key] = row
        if latest:
            with self._write() as conn:
                conn.exec_driver_sql(self._store._upsert_metric, list(latest.values()))
        return len(latest)

    def add_report(self, report: Report, received_ns: int) -> bool:
        """Store a report and its evidence in one transaction; False when its id is stored."""
        report = dataclasses.replace(report, evidence=self._sealed(report.evidence))
        try:
            return self._add_report(report, received_ns)
        except sa.exc.IntegrityError:
            return False  # the same id stored by a concurrent request (a retry that raced)

    def _add_report(self, report: Report, received_ns: int) -> bool:
        diagnosis = report.diagnosis
        root = diagnosis.get("root_cause") or {}
        with self._write() as conn:
            exists = conn.execute(
                sa.select(s.reports.c.id).where(
                    s.reports.c.tenant == self.tenant, s.reports.c.id == report.id
                )
            ).first()
            if exists is not None:
                return False
            conn.execute(
                s.reports.insert().values(
                    tenant=self.tenant,
                    id=report.id,
                    job=report.job,
                    user_name=report.user,
                    status=diagnosis["status"],
                    category=root.get("category") or "unknown",
                    signature=root.get("signature"),
                    confidence=float(root.get("confidence") or 0.0),
                    root_host=root.get("host"),
                    root_rank=root.get("rank"),
                    hosts=jsonio.dumps(report.hosts).decode(),
                    ranks=jsonio.dumps(report.ranks).decode(),
                    scheduler=jsonio.dumps(report.scheduler).decode(),
                    ended_ns=report.ended_ns,
                    received_ns=received_ns,
                    diagnosis=jsonio.dumps(diagnosis).decode(),
                    started_ns=report.started_ns,
                    workload=report.name,
                    gpus=jsonio.dumps(report.gpus).decode(),
                    labels=jsonio.dumps(report.labels).decode(),
                )
            )
            if report.hosts:
                conn.execute(
                    s.report_hosts.insert(),
                    [
                        {
                            "tenant": self.tenant,
                            "host": h,
                            "report_id": report.id,
                            "ended_ns": report.ended_ns,
                        }
                        for h in report.hosts
                    ],
                )
            named = {
                (gpu[key], gpu["host"])
                for gpu in report.gpus
                for key in ("serial", "uuid")
                if gpu.get(key)
            }
            if named:
                conn.execute(
                    s.report_gpus.insert(),
                    [
                        {
                            "tenant": self.tenant,
                            "gpu": gpu,
                            "report_id": report.id,
                            "host": host,
                            "ended_ns": report.ended_ns,
                        }
                        for gpu, host in sorted(dict(named).items())
                    ],
                )
            self._insert_batch(conn, report.evidence)
        return True

    # --- evidence --------------------------------------------------------------------------

    def evidence(self, evidence_id: str) -> dict[str, Any]:
        t = s.evidence
        with self._read() as conn:
            row = conn.execute(
                sa.select(t).where(t.c.tenant == self.tenant, t.c.id == evidence_id)
            ).first()
        if row is None:
            raise NotFound(f"no evidence {evidence_id!r}")
        return evidence_dict(row)

    def sealed_body(self, evidence_id: str) -> str | None:
        """The stored body of a sensitive evidence row, still sealed; None when the row is
        not sensitive (NotFound when there is no such row)."""
        t = s.evidence
        with self._read() as conn:
            body = conn.execute(
                sa.select(t.c.body).where(t.c.tenant == self.tenant, t.c.id == evidence_id)
            ).scalar()
        if body is None:
            raise NotFound(f"no evidence {evidence_id!r}")
        return body if envelope.is_sealed_value(body) else None

    def list_evidence(
        self,
        *,
        host: str | None = None,
        job: str | None = None,
        category: str | None = None,
        since: int | None = None,
        until: int | None = None,
        limit: int = 100,
        cursor: tuple[Any, ...] | None = None,
    ) -> Page:
        t = s.evidence
        query = sa.select(t).where(t.c.tenant == self.tenant)
        query = _filters(query, t, host=host, job=job, category=category)
        query = _time(query, t.c.ts_ns, since, until)
        if cursor is not None:
            query = query.where(sa.tuple_(t.c.ts_ns, t.c.id) < tuple(cursor))
        query = query.order_by(t.c.ts_ns.desc(), t.c.id.desc()).limit(limit + 1)
        with self._read() as conn:
            rows = conn.execute(query).all()
        return _page([evidence_dict(r) for r in rows], limit, ("ts_ns", "id"))

    # --- hosts -----------------------------------------------------------------------------

    def hosts(self, *, limit: int = 100, cursor: tuple[Any, ...] | None = None) -> Page:
        t = s.hosts
        query = sa.select(t).where(t.c.tenant == self.tenant)
        if cursor is not None:
            query = query.where(t.c.name > cursor[0])
        query = query.order_by(t.c.name).limit(limit + 1)
        with self._read() as conn:
            rows = conn.execute(query).all()
        items = [{"name": r.name, "first_ns": r.first_ns, "last_ns": r.last_ns} for r in rows]
        return _page(items, limit, ("name",))

    def host(self, name: str, *, since: int | None, until: int | None, limit: int) -> dict:
        """A host's history: its newest `limit` evidence in the window, the newest incidents
        and jobs that name it (HISTORY_LINKS of each; the list endpoints page through more)."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(s.hosts).where(s.hosts.c.tenant == self.tenant, s.hosts.c.name == name)
            ).first()
            if row is None:
                raise NotFound(f"no host {name!r}")
            ev = s.evidence
            query = sa.select(ev).where(ev.c.tenant == self.tenant, ev.c.host == name)
            query = _time(query, ev.c.ts_ns, since, until)
            evidence = conn.execute(
                query.order_by(ev.c.ts_ns.desc(), ev.c.id.desc()).limit(limit)
            ).all()
            links = s.incident_links
            incident_ids = (
                sa.select(links.c.incident_id)
                .where(links.c.tenant == self.tenant, links.c.kind == "host", links.c.ref == name)
                .scalar_subquery()
            )
            inc = s.incidents
            incidents = conn.execute(
                sa.select(inc)
                .where(inc.c.tenant == self.tenant, inc.c.id.in_(incident_ids))
                .order_by(inc.c.last_ns.desc(), inc.c.id.desc())
                .limit(HISTORY_LINKS)
            ).all()
            rh = s.report_hosts
            jobs = conn.execute(
                sa.select(s.reports)
                .join(
                    rh, sa.and_(rh.c.tenant == s.reports.c.tenant, rh.c.report_id == s.reports.c.id)
                )
                .where(rh.c.tenant == self.tenant, rh.c.host == name)
                .order_by(rh.c.ended_ns.desc())
                .limit(HISTORY_LINKS)
            ).all()
            metrics = conn.execute(
                sa.select(s.host_metrics)
                .where(s.host_metrics.c.tenant == self.tenant, s.host_metrics.c.host == name)
                .order_by(s.host_metrics.c.name, s.host_metrics.c.labels)
                .limit(1000)
            ).all()
        return {
            "name": row.name,
            "first_ns": row.first_ns,
            "last_ns": row.last_ns,
            "evidence": [evidence_dict(r) for r in evidence],
            "incidents": [incident_dict(r, None) for r in incidents],
            "jobs": [report_dict(r, full=False) for r in jobs],
            "metrics": [
                {
                    "name": m.name,
                    "labels": jsonio.loads(m.labels),
                    "ts_ns": m.ts_ns,
                    "value": m.value,
                }
                for m in metrics
            ],
        }

    # --- jobs (reports) ----------------------------------------------------------------------

    def jobs(
        self,
        *,
        job: str | None = None,
        user: str | None = None,
        category: str | None = None,
        host: str | None = None,
        gpu: str | None = None,
        status: str | None = None,
        since: int | None = None,
        until: int | None = None,
        limit: int = 100,
        cursor: tuple[Any, ...] | None = None,
    ) -> Page:
        """Reports, newest first; `gpu` is a GPU's serial or UUID (its jobs on any host)."""
        r = s.reports
        query = sa.select(r).where(r.c.tenant == self.tenant)
        if job is not None:
            query = query.where(r.c.job == job)
        if user is not None:
            query = query.where(r.c.user_name == user)
        if category is not None:
            query = query.where(r.c.category == category)
        if status is not None:
            query = query.where(r.c.status == status)
        if host is not None:
            rh = s.report_hosts
            query = query.where(
                r.c.id.in_(
                    sa.select(rh.c.report_id).where(rh.c.tenant == self.tenant, rh.c.host == host)
                )
            )
        if gpu is not None:
            rg = s.report_gpus
            query = query.where(
                r.c.id.in_(
                    sa.select(rg.c.report_id).where(rg.c.tenant == self.tenant, rg.c.gpu == gpu)
                )
            )
        query = _time(query, r.c.ended_ns, since, until)
        if cursor is not None:
            query = query.where(sa.tuple_(r.c.ended_ns, r.c.id) < tuple(cursor))
        query = query.order_by(r.c.ended_ns.desc(), r.c.id.desc()).limit(limit + 1)
        with self._read() as conn:
            rows = conn.execute(query).all()
        return _page([report_dict(row, full=False) for row in rows], limit, ("ended_ns", "id"))

    def report(self, report_id: str) -> dict[str, Any]:
        r = s.reports
        with self._read() as conn:
            row = conn.execute(
                sa.select(r).where(r.c.tenant == self.tenant, r.c.id == report_id)
            ).first()
        if row is None:
            raise NotFound(f"no report {report_id!r}")
        return report_dict(row, full=True)

    def job(self, job: str) -> dict[str, Any]:
        r = s.reports
        with self._read() as conn:
            rows = conn.execute(
                sa.select(r)
                .where(r.c.tenant == self.tenant, r.c.job == job)
                .order_by(r.c.ended_ns.desc())
                .limit(100)
            ).all()
        if not rows:
            raise NotFound(f"no job {job!r}")
        return {"job": job, "reports": [report_dict(row, full=True) for row in rows]}

    # --- incidents -------------------------------------------------------------------------

    def incidents(
        self,
        *,
        status: str | None = None,
        host: str | None = None,
        job: str | None = None,
        category: str | None = None,
        kind: str | None = None,
        component: str | None = None,
        roots: bool = False,
        since: int | None = None,
        until: int | None = None,
        limit: int = 100,
        cursor: tuple[Any, ...] | None = None,
    ) -> Page:
        """Newest first; `kind` and `component` select one component's incidents (a GPU
        serial's history: kind=gpu, component=<serial>); `roots` leaves out the jobs' own
        incidents that a fleet incident holds as children (its story tells theirs)."""
        inc = s.incidents
        query = sa.select(inc).where(inc.c.tenant == self.tenant)
        query = _filters(
            query,
            inc,
            status=status,
            category=category,
            component_kind=kind,
            component_id=component,
        )
        links = s.incident_links
        for kind, ref in (("host", host), ("job", job)):
            if ref is not None:
                query = query.where(
                    inc.c.id.in_(
                        sa.select(links.c.incident_id).where(
                            links.c.tenant == self.tenant, links.c.kind == kind, links.c.ref == ref
                        )
                    )
                )
        if roots:
            query = query.where(
                inc.c.id.not_in(
                    sa.select(links.c.incident_id).where(
                        links.c.tenant == self.tenant, links.c.kind == "parent"
                    )
                )
            )
        query = _time(query, inc.c.last_ns, since, until)
        if cursor is not None:
            query = query.where(sa.tuple_(inc.c.last_ns, inc.c.id) < tuple(cursor))
        query = query.order_by(inc.c.last_ns.desc(), inc.c.id.desc()).limit(limit + 1)
        with self._read() as conn:
            rows = conn.execute(query).all()
        return _page([incident_dict(r, None) for r in rows], limit, ("last_ns", "id"))

    def incident(self, incident_id: int) -> dict[str, Any]:
        with self._read() as conn:
            return self._incident(conn, incident_id)

    def _incident(self, conn: Connection, incident_id: int) -> dict[str, Any]:
        inc = s.incidents
        row = conn.execute(
            sa.select(inc).where(inc.c.tenant == self.tenant, inc.c.id == incident_id)
        ).first()
        if row is None:
            raise NotFound(f"no incident {incident_id}")
        links = s.incident_links
        refs: dict[str, list[str]] = {"evidence": [], "job": [], "host": [], "report": []}
        for kind, ref in conn.execute(
            sa.select(links.c.kind, links.c.ref)
            .where(links.c.tenant == self.tenant, links.c.incident_id == incident_id)
            .order_by(links.c.kind, links.c.ref)
        ):
            refs.setdefault(kind, []).append(ref)
        out = incident_dict(row, refs)
        if out["children"]:
            out["child_incidents"] = [
                {
                    "id": r.id,
                    "job": r.component_id,
                    "title": r.title,
                    "category": r.category,
                    "status": r.status,
                    "last_ns": r.last_ns,
                }
                for r in conn.execute(
                    sa.select(inc)
                    .where(inc.c.tenant == self.tenant, inc.c.id.in_(out["children"]))
                    .order_by(inc.c.last_ns.desc(), inc.c.id.desc())
                )
            ]
        return out

    def transition(
        self, incident_id: int, to: str, who: str, now_ns: int, note: str | None = None
    ) -> dict[str, Any]:
        """open → acknowledged → resolved (resolving an open one directly is allowed); a note
        given on resolving says what was done (retrieval shows it with similar incidents)."""
        allowed = {"acknowledged": ("open",), "resolved": ("open", "acknowledged")}
        if to not in allowed:
            raise ValueError(f"no transition to {to!r}")
        inc = s.incidents
        with self._write() as conn:
            current = self._incident(conn, incident_id)
            if current["status"] not in allowed[to]:
                raise Conflict(f"incident {incident_id} is {current['status']}, cannot be {to}")
            by, at = (
                ("acknowledged_by", "acknowledged_ns")
                if to == "acknowledged"
                else (
                    "resolved_by",
                    "resolved_ns",
                )
            )
            conn.execute(
                inc.update()
                .where(inc.c.tenant == self.tenant, inc.c.id == incident_id)
                .values({"status": to, by: who, at: now_ns, "updated_ns": now_ns})
            )
            if to == "resolved" and note:
                conn.execute(
                    inc.update()
                    .where(inc.c.tenant == self.tenant, inc.c.id == incident_id)
                    .values(resolution=note)
                )
            return self._incident(conn, incident_id)

    # --- retrieval: incidents and their stored embeddings ----------------------------------

    def incident_vectors(
        self, model: str, limit: int, *, exclude_report: str | None = None
    ) -> list[tuple[dict[str, Any], Any]]:
        """The tenant's latest incidents (at most `limit`), each with its stored vector row
        for `model` ((text_key, bytes), or None when it has none yet); without the ones
        opened from `exclude_report` (the asking run's own)."""
        inc, vec, links = s.incidents, s.incident_vectors, s.incident_links
        query = (
            sa.select(inc, vec.c.text_key, vec.c.vector)
            .select_from(
                inc.outerjoin(
                    vec,
                    sa.and_(
                        vec.c.tenant == inc.c.tenant,
                        vec.c.incident_id == inc.c.id,
                        vec.c.model == model,
                    ),
                )
            )
            .where(inc.c.tenant == self.tenant)
            .order_by(inc.c.last_ns.desc(), inc.c.id.desc())
            .limit(limit)
        )
        if exclude_report is not None:
            query = query.where(
                ~inc.c.id.in_(
                    sa.select(links.c.incident_id).where(
                        links.c.tenant == self.tenant,
                        links.c.kind == "report",
                        links.c.ref == exclude_report,
                    )
                )
            )
        with self._read() as conn:
            rows = conn.execute(query).all()
        return [
            (incident_dict(r, None), None if r.vector is None else (r.text_key, bytes(r.vector)))
            for r in rows
        ]

    def store_incident_vectors(self, model: str, rows: Sequence[tuple[int, str, bytes]]) -> None:
        """(incident id, text key, float32 bytes) for `model`, replacing older ones."""
        if not rows:
            return
        vec = s.incident_vectors
        with self._write() as conn:
            conn.execute(
                vec.delete().where(
                    vec.c.tenant == self.tenant,
                    vec.c.model == model,
                    vec.c.incident_id.in_([r[0] for r in rows]),
                )
            )
            conn.execute(
                vec.insert(),
                [
                    {
                        "tenant": self.tenant,
                        "incident_id": i,
                        "model": model,
                        "text_key": k,
                        "vector": v,
                    }
                    for i, k, v in rows
                ],
            )

    # --- the leader's writes (behind the fence) -----------------------------------------------

    def pending_reports(self, limit: int) -> list[dict[str, Any]]:
        r = s.reports
        with self._read() as conn:
            rows = conn.execute(
                sa.select(r)
                .where(r.c.tenant == self.tenant, r.c.correlated == 0)
                .order_by(r.c.received_ns, r.c.id)
                .limit(limit)
            ).all()
        return [report_dict(row, full=True) for row in rows]

    def record_incidents(
        self, candidates: Sequence[dict[str, Any]], done_reports: Sequence[str], now_ns: int
    ) -> list[int]:
        """Open (or grow) incidents and mark reports correlated, in one fenced transaction.
        A candidate whose dedupe_key names an open incident adds its links to that one."""
        if self._fence is None:
            raise PermissionError("incidents are written by the leader, behind its fence")
        inc, links = s.incidents, s.incident_links
        ids: list[int] = []
        with self._write() as conn:
            for cand in candidates:
                row = conn.execute(
                    sa.select(inc.c.id, inc.c.first_ns, inc.c.last_ns).where(
                        inc.c.tenant == self.tenant, inc.c.dedupe_key == cand["dedupe_key"]
                    )
                ).first()
                if row is None:
                    incident_id = conn.execute(
                        inc.insert()
                        .values(
                            tenant=self.tenant,
                            dedupe_key=cand["dedupe_key"],
                            rule=cand["rule"],
                            category=cand["category"],
                            component_kind=cand["component_kind"],
                            component_id=cand["component_id"],
                            title=cand["title"],
                            explanation=cand["explanation"],
                            confidence=float(cand["confidence"]),
                            status="open",
                            first_ns=cand["first_ns"],
                            last_ns=cand["last_ns"],
                            opened_ns=now_ns,
                            updated_ns=now_ns,
                            epoch=self._fence.epoch,
                        )
                        .returning(inc.c.id)
                    ).scalar_one()
                else:
                    incident_id = row.id
                    conn.execute(
                        inc.update()
                        .where(inc.c.tenant == self.tenant, inc.c.id == incident_id)
                        .values(
                            first_ns=min(row.first_ns, cand["first_ns"]),
                            last_ns=max(row.last_ns, cand["last_ns"]),
                            updated_ns=now_ns,
                            epoch=self._fence.epoch,
                        )
                    )
                existing = {
                    (kind, ref)
                    for kind, ref in conn.execute(
                        sa.select(links.c.kind, links.c.ref).where(
                            links.c.tenant == self.tenant, links.c.incident_id == incident_id
                        )
                    )
                }
                new = sorted(
                    {(kind, ref) for kind, refs in cand["links"].items() for ref in refs} - existing
                )
                if new:
                    conn.execute(
                        links.insert(),
                        [
                            {"tenant": self.tenant, "incident_id": incident_id, "kind": k, "ref": r}
                            for k, r in new
                        ],
                    )
                ids.append(int(incident_id))
            if done_reports:
                r = s.reports
                conn.execute(
                    r.update()
                    .where(r.c.tenant == self.tenant, r.c.id.in_(list(done_reports)))
                    .values(correlated=1)
                )
        return ids

    def delete_evidence_before(self, cutoff_ns: int) -> int:
        """Retention by age (the leader's, fenced): evidence older than `cutoff_ns`."""
        ev = s.evidence
        with self._write() as conn:
            old = sa.or_(
                sa.and_(ev.c.ts_ns > 0, ev.c.ts_ns < cutoff_ns),
                sa.and_(ev.c.ts_ns == 0, ev.c.received_ns < cutoff_ns),  # no time of its own
            )
            result = conn.execute(ev.delete().where(ev.c.tenant == self.tenant, old))
            return int(result.rowcount)

    def trim_evidence(self, max_rows: int) -> int:
        """Retention by size: keep the newest `max_rows` evidence rows of this tenant."""
        ev = s.evidence
        with self._write() as conn:
            boundary = conn.execute(
                sa.select(ev.c.ts_ns, ev.c.id)
                .where(ev.c.tenant == self.tenant)
                .order_by(ev.c.ts_ns.desc(), ev.c.id.desc())
                .offset(max_rows)
                .limit(1)
            ).first()
            if boundary is None:
                return 0
            result = conn.execute(
                ev.delete().where(
                    ev.c.tenant == self.tenant,
                    sa.tuple_(ev.c.ts_ns, ev.c.id) <= (boundary.ts_ns, boundary.id),
                )
            )
            return int(result.rowcount)


def check_fence(conn: Connection, fence: Fence, *, postgres: bool) -> None:
    """Raise Fenced unless `fence` is the current epoch; the row lock (PostgreSQL) holds a
    newer leader's epoch bump back until this transaction ends."""
    query = sa.select(s.leader.c.epoch).where(s.leader.c.name == fence.name)
    if postgres:
        query = query.with_for_update(read=True, key_share=True)
    epoch = conn.execute(query).scalar()
    if epoch != fence.epoch:
        raise Fenced(f"leader epoch {fence.epoch} superseded by {epoch}")


# --- rows → JSON-able dicts -------------------------------------------------------------------


def evidence_dict(row: Any) -> dict[str, Any]:
    # unpacked by position (the table's column order): a Row's attribute access costs more
    # than the rest of this function, and it runs for every row of every page
    (_tenant, id_, ts_ns, received_ns, host, job, rank, pid, source, kind, signature,
     category, severity, summary, action, body, attrs) = row  # fmt: skip
    extra = jsonio.loads(attrs)
    sealed = envelope.is_sealed_value(body)
    out = {
        "id": id_,
        "ts_ns": ts_ns,  # 0: the source gave no time
        "ts": iso(ts_ns),
        "received_ns": received_ns,
        "host": host,
        "job": job,
        "rank": rank,
        "pid": pid,
        "source": source,
        "kind": kind,
        "signature": signature,
        "category": category,
        "severity": severity,
        "summary": summary,
        "action": action,
        "body": WITHHELD if sealed else body,
        "attrs": extra.get("attrs", {}),
        "captures": extra.get("captures", {}),
    }
    if sealed:
        out["sensitive"] = True  # the body is sealed at rest (denpex.control.sensitive)
    return out


def report_dict(row: Any, *, full: bool) -> dict[str, Any]:
    out = {
        "id": row.id,
        "job": row.job,
        "user": row.user_name,
        "status": row.status,
        "category": row.category,
        "signature": row.signature,
        "confidence": row.confidence,
        "host": row.root_host,
        "rank": row.root_rank,
        "hosts": jsonio.loads(row.hosts),
        "ranks": jsonio.loads(row.ranks),
        "scheduler": jsonio.loads(row.scheduler),
        "ended_ns": row.ended_ns,
        "received_ns": row.received_ns,
    }
    if full:
        out["started_ns"] = row.started_ns
        out["name"] = row.workload
        out["gpus"] = jsonio.loads(row.gpus)
        out["labels"] = jsonio.loads(row.labels)
        out["diagnosis"] = jsonio.loads(row.diagnosis)
    return out


def incident_dict(row: Any, links: dict[str, list[str]] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row.id,
        "rule": row.rule,
        "category": row.category,
        "component": {"kind": row.component_kind, "id": row.component_id},
        "title": row.title,
        "explanation": row.explanation,
        "confidence": row.confidence,
        "score": row.score,
        "rules": jsonio.loads(row.rules) or [row.rule],
        "action": row.action,
        "status": row.status,
        "first_ns": row.first_ns,
        "last_ns": row.last_ns,
        "opened_ns": row.opened_ns,
        "updated_ns": row.updated_ns,
        "acknowledged": {"by": row.acknowledged_by, "ns": row.acknowledged_ns},
        "resolved": {"by": row.resolved_by, "ns": row.resolved_ns, "note": row.resolution},
    }
    if links is not None:
        out["evidence"] = links.get("evidence", [])
        out["jobs"] = links.get("job", [])
        out["hosts"] = links.get("host", [])
        out["reports"] = links.get("report", [])
        # one story: a fleet incident is the root of the jobs' own incidents it explains
        out["parents"] = sorted(int(i) for i in links.get("parent", []))
        out["children"] = sorted(int(i) for i in links.get("child", []))
    return out


def _filters(query: Any, table: sa.Table, **equal: str | None) -> Any:
    for column, value in equal.items():
        if value is not None:
            query = query.where(table.c[column] == value)
    return query


def _time(query: Any, column: Any, since: int | None, until: int | None) -> Any:
    if since is not None:
        query = query.where(column >= since)
    if until is not None:
        query = query.where(column < until)
    return query


def _page(items: list[dict[str, Any]], limit: int, keys: tuple[str, ...]) -> Page:
    if len(items) <= limit:
        return Page(items, None)
    items = items[:limit]
    last = items[-1]
    return Page(items, encode_cursor(tuple(last[k] for k in keys)))


def encode_cursor(values: tuple[Any, ...]) -> str:
    import base64

    return base64.urlsafe_b64encode(jsonio.dumps(list(values))).decode().rstrip("=")


def decode_cursor(text: str, arity: int) -> tuple[Any, ...]:
    """A cursor from encode_cursor; ValueError for anything else."""
    import base64

    try:
        values = jsonio.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except (ValueError, TypeError):
        raise ValueError("cursor is not one this server gave out") from None
    if not isinstance(values, list) or len(values) != arity:
        raise ValueError("cursor is not one this server gave out")
    if not all(isinstance(v, str | int) and not isinstance(v, bool) for v in values):
        raise ValueError("cursor is not one this server gave out")
    return tuple(values)
