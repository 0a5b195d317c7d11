"""The leader's reads and fenced writes for the fleet rules (denpex.control.fleet): a
tenant's recent reports and agent evidence, host state from the agents' metrics, its open
fleet incidents as the rules' Incident records, and a MergeResult applied in one fenced
transaction (opened, grown, resolved by rule).

Reached only through a TenantStore from `Store.for_leader` (its tenant filter, its tenant-
bound transactions, its fence): it must never write without the fence, and never read a row
of another tenant.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from denpex.control import schema as s
from denpex.control.fleet.model import Incident, MergeResult
from denpex.control.store import TenantStore, evidence_dict, report_dict
from denpex.core import jsonio

UNRESOLVED = ("open", "acknowledged")
JOB_KIND = "job"  # the per-job incidents (correlation.report_candidates): not the fleet's
# the rules read an agent's warnings and worse; its info lines never make a strike
RULE_SEVERITIES = ("warning", "error", "critical")


class FleetStore:
    """One tenant's fleet reads and writes, over a leader's TenantStore."""

    def __init__(self, tenant_store: TenantStore) -> None:
        self.ts = tenant_store
        self.tenant = tenant_store.tenant

    # --- reads ---------------------------------------------------------------------------

    def reports_since(self, ended_ns: int) -> list[dict[str, Any]]:
        """Every report (full) of jobs that ended at or after `ended_ns`, oldest first."""
        r = s.reports
        with self.ts._read() as conn:
            rows = conn.execute(
                sa.select(r)
                .where(r.c.tenant == self.tenant, r.c.ended_ns >= ended_ns)
                .order_by(r.c.ended_ns, r.c.id)
            ).all()
        return [report_dict(row, full=True) for row in rows]

    def evidence_since(self, ts_ns: int) -> list[dict[str, Any]]:
        """Evidence of warning severity or worse with a time at or after `ts_ns` (the
        evidence_ts index), oldest first; report timelines included (the caller knows them
        by their `<report id>/` prefix)."""
        ev = s.evidence
        with self.ts._read() as conn:
            rows = conn.execute(
                sa.select(ev)
                .where(
                    ev.c.tenant == self.tenant,
                    ev.c.ts_ns >= max(ts_ns, 1),
                    ev.c.severity.in_(RULE_SEVERITIES),
                )
                .order_by(ev.c.ts_ns, ev.c.id)
            ).all()
        return [evidence_dict(row) for row in rows]

    def host_metrics(self, names: tuple[str, ...]) -> list[tuple[str, str, dict, int, float]]:
        """(host, name, labels, ts_ns, value) of the named series, newest last."""
        hm = s.host_metrics
        with self.ts._read() as conn:
            rows = conn.execute(
                sa.select(hm.c.host, hm.c.name, hm.c.labels, hm.c.ts_ns, hm.c.value)
                .where(hm.c.tenant == self.tenant, hm.c.name.in_(list(names)))
                .order_by(hm.c.ts_ns)
            ).all()
        return [(r.host, r.name, jsonio.loads(r.labels), r.ts_ns, r.value) for r in rows]

    def open_incidents(self, *, resolved: bool = False) -> list[Incident]:
        """The tenant's unresolved fleet incidents (not the per-job ones); `resolved`: its
        resolved ones instead."""
        inc, links = s.incidents, s.incident_links
        status = inc.c.status.notin_(UNRESOLVED) if resolved else inc.c.status.in_(UNRESOLVED)
        with self.ts._read() as conn:
            rows = conn.execute(
                sa.select(inc)
                .where(
                    inc.c.tenant == self.tenant,
                    status,
                    inc.c.component_kind != JOB_KIND,
                )
                .order_by(inc.c.id)
            ).all()
            refs: dict[int, dict[str, list[str]]] = {r.id: {} for r in rows}
            if rows:
                for incident_id, kind, ref in conn.execute(
                    sa.select(links.c.incident_id, links.c.kind, links.c.ref)
                    .where(links.c.tenant == self.tenant, links.c.incident_id.in_(list(refs)))
                    .order_by(links.c.incident_id, links.c.kind, links.c.ref)
                ):
                    refs[incident_id].setdefault(kind, []).append(ref)
        return [_incident(row, refs[row.id], self.tenant) for row in rows]

    # --- the fenced write --------------------------------------------------------------------

    def apply(self, result: MergeResult, now_ns: int) -> dict[str, list[int]]:
        """Open, grow and resolve as `result` says, in one fenced transaction; returns the
        ids touched by kind of change."""
        fence = self.ts._fence
        if fence is None:
            raise PermissionError("incidents are written by the leader, behind its fence")
        done: dict[str, list[int]] = {"opened": [], "updated": [], "resolved": []}
        if not result.changed:
            return done
        inc = s.incidents
        with self.ts._write() as conn:
            for incident in result.opened:
                earlier = conn.execute(
                    sa.select(sa.func.count())
                    .select_from(inc)
                    .where(
                        inc.c.tenant == self.tenant,
                        inc.c.component_kind == incident.kind,
                        inc.c.component_id == incident.component,
                    )
                ).scalar_one()
                new_id = conn.execute(
                    inc.insert()
                    .values(
                        tenant=self.tenant,
                        dedupe_key=f"fleet:{incident.kind}:{incident.component}#{earlier + 1}",
                        rule=incident.rules[0],
                        rules=jsonio.dumps(list(incident.rules)).decode(),
                        category=incident.category,
                        component_kind=incident.kind,
                        component_id=incident.component,
                        title=f"{incident.kind} {incident.component}: {incident.category}",
                        explanation=incident.explanation,
                        confidence=incident.confidence,
                        score=incident.score,
                        action=incident.action,
                        status="open",
                        first_ns=incident.first_ns,
                        last_ns=incident.last_ns,
                        opened_ns=now_ns,
                        updated_ns=now_ns,
                        epoch=fence.epoch,
                    )
                    .returning(inc.c.id)
                ).scalar_one()
                self._link(conn, new_id, "evidence", incident.evidence)
                self._link(conn, new_id, "job", incident.jobs)
                self._link(conn, new_id, "host", incident.hosts)
                self._adopt(conn, int(new_id), incident.jobs)
                done["opened"].append(int(new_id))
            for update in result.updated:
                grown = update.incident
                incident_id = int(grown.id or 0)
                conn.execute(
                    inc.update()
                    .where(inc.c.tenant == self.tenant, inc.c.id == incident_id)
                    .values(
                        rules=jsonio.dumps(list(grown.rules)).decode(),
                        confidence=grown.confidence,
                        score=grown.score,
                        explanation=grown.explanation,
                        first_ns=grown.first_ns,
                        last_ns=grown.last_ns,
                        updated_ns=now_ns,
                        epoch=fence.epoch,
                    )
                )
                self._link(conn, incident_id, "evidence", update.added_evidence)
                self._link(conn, incident_id, "job", update.added_jobs)
                self._link(conn, incident_id, "host", grown.hosts)
                self._adopt(conn, incident_id, update.added_jobs)
                done["updated"].append(incident_id)
            for resolution in result.resolved:
                incident_id = int(resolution.incident.id or 0)
                conn.execute(
                    inc.update()
                    .where(
                        inc.c.tenant == self.tenant,
                        inc.c.id == incident_id,
                        inc.c.status.in_(UNRESOLVED),
                    )
                    .values(
                        status="resolved",
                        resolved_by=f"rule:{resolution.rule}",
                        resolved_ns=now_ns,
                        resolution=resolution.explanation,
                        updated_ns=now_ns,
                        epoch=fence.epoch,
                    )
                )
                self._link(conn, incident_id, "resolution", resolution.evidence)
                done["resolved"].append(incident_id)
        return done

    def adopt_late_jobs(self, jobs: Any) -> None:
        """Job incidents recorded after the fleet incident that already names their job (a
        rank's report that came in later): children of it as well, behind the fence."""
        jobs = sorted(set(jobs))
        if not jobs or self.ts._fence is None:
            return
        inc, links = s.incidents, s.incident_links
        with self.ts._write() as conn:
            parents = conn.execute(
                sa.select(inc.c.id, links.c.ref)
                .join(
                    links, sa.and_(links.c.tenant == inc.c.tenant, links.c.incident_id == inc.c.id)
                )
                .where(
                    inc.c.tenant == self.tenant,
                    inc.c.status.in_(UNRESOLVED),
                    inc.c.component_kind != JOB_KIND,
                    links.c.kind == "job",
                    links.c.ref.in_(jobs),
                )
            ).all()
            for incident_id, job in parents:
                self._adopt(conn, int(incident_id), [job])

    def _adopt(self, conn: Connection, incident_id: int, jobs: Any) -> None:
        """The jobs' own incidents become children of this fleet incident (links `child`
        here, `parent` there): one story, the fleet incident its root. Each keeps its own
        lifecycle; remediation plans once, for the root (RemediationStore.superseded_by)."""
        jobs = sorted(set(jobs))
        if not jobs:
            return
        inc, links = s.incidents, s.incident_links
        children = conn.execute(
            sa.select(inc.c.id)
            .join(links, sa.and_(links.c.tenant == inc.c.tenant, links.c.incident_id == inc.c.id))
            .where(
                inc.c.tenant == self.tenant,
                inc.c.component_kind == JOB_KIND,
                links.c.kind == "job",
                links.c.ref.in_(jobs),
            )
        ).scalars()
        ids = sorted({int(i) for i in children})
        self._link(conn, incident_id, "child", [str(i) for i in ids])
        for child in ids:
            self._link(conn, child, "parent", [str(incident_id)])

    def _link(self, conn: Connection, incident_id: int, kind: str, refs: Any) -> None:
        links = s.incident_links
        wanted = set(refs)
        if not wanted:
            return
        known = set(
            conn.execute(
                sa.select(links.c.ref).where(
                    links.c.tenant == self.tenant,
                    links.c.incident_id == incident_id,
                    links.c.kind == kind,
                )
            ).scalars()
        )
        new = sorted(wanted - known)
        if new:
            conn.execute(
                links.insert(),
                [
                    {"tenant": self.tenant, "incident_id": incident_id, "kind": kind, "ref": ref}
                    for ref in new
                ],
            )


def _incident(row: Any, refs: dict[str, list[str]], tenant: str) -> Incident:
    return Incident(
        id=str(row.id),
        kind=row.component_kind,
        component=row.component_id,
        category=row.category,
        confidence=row.confidence,
        rules=tuple(jsonio.loads(row.rules) or [row.rule]),
        evidence=tuple(refs.get("evidence", ())),
        jobs=tuple(refs.get("job", ())),
        hosts=tuple(refs.get("host", ())),
        first_ns=row.first_ns,
        last_ns=row.last_ns,
        explanation=row.explanation,
        state=row.status,
        action=row.action,
        tenants=(tenant,),
        score=row.score,
    )
