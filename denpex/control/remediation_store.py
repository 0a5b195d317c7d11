"""Remediation in the store: plans proposed from incidents, the executor's step records
(written behind the leader's epoch fence), human decisions (approve, reject, guard reset),
the tenant's policy, and the audit record of each, committed in the same transaction.

Every query filters by the tenant this handle is bound to (an authenticated Principal's, or
the leader's for one tenant). It must never write a plan or a step record for the leader
without checking its fence, nor let a decision through without naming the human.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from denpex.control import schema as s
from denpex.control.fenced_store import FencedTenantStore
from denpex.control.store import Conflict, NotFound
from denpex.core import jsonio
from denpex.remediation import executor as ex
from denpex.remediation.machine import Event, State, info
from denpex.remediation.plan import Plan, plan_from_dict
from denpex.remediation.policy import Policy, Tier, default_policy_dict, parse_policy

P, ST = s.remediation_plans, s.remediation_steps


class RemediationStore(FencedTenantStore):
    subject = "remediation"

    # --- policy ------------------------------------------------------------------------------

    def policy(self) -> Policy:
        with self.db.system_tx() as conn:
            raw = conn.execute(
                sa.select(s.remediation_policies.c.policy).where(
                    s.remediation_policies.c.tenant == self.tenant
                )
            ).scalar()
        return parse_policy(jsonio.loads(raw) if raw else default_policy_dict())

    def set_policy(self, data: Mapping[str, Any], who: str, now_ns: int) -> Policy:
        new = parse_policy(data)  # refuses a bad policy before anything is written
        old = self.policy()
        t = s.remediation_policies
        with self._write(fenced=False) as conn:
            conn.execute(t.delete().where(t.c.tenant == self.tenant))
            conn.execute(
                t.insert().values(
                    tenant=self.tenant,
                    policy=jsonio.dumps(dict(data)).decode(),
                    updated_ns=now_ns,
                    updated_by=who,
                )
            )
            self._audit(
                conn,
                now_ns,
                "policy.changed",
                who,
                subject="remediation policy",
                result={"from": old.digest(), "to": new.digest(), "tier": str(new.tier)},
            )
        return new

    # --- the leader: proposing ---------------------------------------------------------------

    def open_incidents(self, limit: int = 500) -> list[dict[str, Any]]:
        inc = s.incidents
        with self.db.tenant_tx(self.tenant) as conn:
            rows = conn.execute(
                sa.select(inc.c.id, inc.c.updated_ns)
                .where(inc.c.tenant == self.tenant, inc.c.status == "open")
                .order_by(inc.c.id)
                .limit(limit)
            ).all()
        return [{"id": int(r.id), "updated_ns": int(r.updated_ns)} for r in rows]

    def superseded_by(self, incident_id: int) -> int | None:
        """For a job's own incident: the open incident of a component (a host, a GPU, a
        switch) that a fleet rule opened for the same job, which a plan acts on instead;
        None when there is none. Two plans for one fault would cordon its host twice."""
        inc, links = s.incidents, s.incident_links
        mine = links.alias("mine")
        with self.db.tenant_tx(self.tenant) as conn:
            kind = conn.execute(
                sa.select(inc.c.component_kind).where(
                    inc.c.tenant == self.tenant, inc.c.id == incident_id
                )
            ).scalar()
            if kind != "job":
                return None
            row = conn.execute(
                sa.select(inc.c.id)
                .join(
                    links, sa.and_(links.c.tenant == inc.c.tenant, links.c.incident_id == inc.c.id)
                )
                .join(
                    mine,
                    sa.and_(
                        mine.c.tenant == links.c.tenant,
                        mine.c.kind == links.c.kind,
                        mine.c.ref == links.c.ref,
                    ),
                )
                .where(
                    inc.c.tenant == self.tenant,
                    inc.c.status == "open",
                    inc.c.component_kind != "job",
                    links.c.kind == "job",  # the fleet rules link the jobs they explain
                    mine.c.incident_id == incident_id,
                )
                .order_by(inc.c.id)
                .limit(1)
            ).first()
        return int(row.id) if row is not None else None

    def incident_evidence(self, incident_id: int) -> list[dict[str, Any]]:
        ev, links = s.evidence, s.incident_links
        with self.db.tenant_tx(self.tenant) as conn:
            rows = conn.execute(
                sa.select(ev.c.id, ev.c.host, ev.c.action, ev.c.attrs).where(
                    ev.c.tenant == self.tenant,
                    ev.c.id.in_(
                        sa.select(links.c.ref).where(
                            links.c.tenant == self.tenant,
                            links.c.incident_id == incident_id,
                            links.c.kind == "evidence",
                        )
                    ),
                )
            ).all()
        out = []
        for row in rows:
            attrs = jsonio.loads(row.attrs) if row.attrs else {}
            flat = {**(attrs.get("attrs") or {}), **(attrs.get("captures") or {})}
            out.append({"id": row.id, "host": row.host, "action": row.action, "attrs": flat})
        return out

    def diagnosis_actions(self, incident: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The `actions` of the diagnoses of an incident's reports."""
        r = s.reports
        ids = list(incident.get("reports") or [])
        if not ids:
            return []
        with self.db.tenant_tx(self.tenant) as conn:
            rows = conn.execute(
                sa.select(r.c.diagnosis).where(r.c.tenant == self.tenant, r.c.id.in_(ids))
            ).scalars()
            out: list[dict[str, Any]] = []
            for text in rows:
                actions = jsonio.loads(text).get("actions") or []
                out.extend(a for a in actions if isinstance(a, dict))
        return out

    def has_plans(self, incident_id: int) -> bool:
        with self.db.system_tx() as conn:
            return (
                conn.execute(
                    sa.select(P.c.id)
                    .where(P.c.tenant == self.tenant, P.c.incident_id == incident_id)
                    .limit(1)
                ).first()
                is not None
            )

    def propose(
        self, plan: Plan, tier: Tier, status: str, note: str, evidence: Sequence[str], now_ns: int
    ) -> int | None:
        """Store a plan (once per incident and host); returns its id, None when it exists."""
        with self._write(fenced=True) as conn:
            exists = conn.execute(
                sa.select(P.c.id).where(
                    P.c.tenant == self.tenant,
                    P.c.incident_id == plan.incident_id,
                    P.c.host == plan.target.host,
                )
            ).first()
            if exists is not None:
                return None
            state = ex.first_state(plan)
            plan_id = conn.execute(
                P.insert()
                .values(
                    tenant=self.tenant,
                    incident_id=plan.incident_id,
                    host=plan.target.host,
                    pool=plan.target.pool,
                    plan=jsonio.dumps(plan.to_dict()).decode(),
                    tier=str(tier),
                    state=str(state),
                    status=status,
                    note=note,
                    created_ns=now_ns,
                    updated_ns=now_ns,
                    epoch=self.fence.epoch if self.fence else 0,
                )
                .returning(P.c.id)
            ).scalar_one()
            self._audit(
                conn,
                now_ns,
                "plan.proposed",
                f"policy:{tier}",
                subject=f"plan {plan_id}",
                why={"incident": plan.incident_id, "evidence": sorted(evidence)[:50]},
                result={
                    "status": status,
                    "steps": [str(x) for x in plan.steps],
                    "target": plan.target.to_dict(),
                    "note": note,
                },
            )
            return int(plan_id)

    # --- the leader: the executor's PlanLog ---------------------------------------------------

    def active_plans(self, limit: int = 100) -> list[ex.PlanRecord]:
        with self.db.system_tx() as conn:
            rows = conn.execute(
                sa.select(P)
                .where(P.c.tenant == self.tenant, P.c.status == ex.ACTIVE)
                .order_by(P.c.id)
                .limit(limit)
            ).all()
            return [self._record(conn, row) for row in rows]

    def _record(self, conn: Connection, row: Any) -> ex.PlanRecord:
        last = conn.execute(
            sa.select(ST.c.state, ST.c.phase)
            .where(ST.c.plan_id == row.id)
            .order_by(ST.c.seq.desc())
            .limit(1)
        ).first()
        interrupted = State(last.state) if last is not None and last.phase == "started" else None
        return ex.PlanRecord(
            int(row.id),
            row.tenant,
            plan_from_dict(jsonio.loads(row.plan)),
            Tier(row.tier),
            State(row.state),
            row.status,
            State(row.approved_step) if row.approved_step else None,
            interrupted,
        )

    def _step_row(
        self,
        conn: Connection,
        plan_id: int,
        state: State,
        phase: str,
        event: Event | None,
        result: Mapping[str, Any],
        now_ns: int,
    ) -> None:
        seq = conn.execute(
            sa.select(sa.func.coalesce(sa.func.max(ST.c.seq), 0)).where(ST.c.plan_id == plan_id)
        ).scalar_one()
        conn.execute(
            ST.insert().values(
                tenant=self.tenant,
                plan_id=plan_id,
                seq=int(seq) + 1,
                state=str(state),
                phase=phase,
                event=str(event) if event else None,
                result=jsonio.dumps(dict(result)).decode(),
                ts_ns=now_ns,
                epoch=self.fence.epoch if self.fence else 0,
            )
        )

    def _actor(self, record: ex.PlanRecord, state: State) -> str:
        if record.approved_step is state:
            with self.db.system_tx() as conn:
                who = conn.execute(sa.select(P.c.decided_by).where(P.c.id == record.id)).scalar()
            return f"{who} (approved)"
        return f"policy:{record.tier}"

    def begin_step(self, record: ex.PlanRecord, state: State, now_ns: int) -> None:
        actor = self._actor(record, state)
        with self._write(fenced=True) as conn:
            self._step_row(conn, record.id, state, "started", None, {}, now_ns)
            self._audit(
                conn,
                now_ns,
                "step.started",
                actor,
                subject=f"plan {record.id} {state}",
                why={"incident": record.plan.incident_id},
                result={"op": str(info(state).op), "target": record.plan.target.to_dict()},
            )

    def finish_step(
        self,
        record: ex.PlanRecord,
        state: State,
        event: Event,
        result: Mapping[str, Any],
        next_state: State,
        status: str,
        now_ns: int,
    ) -> None:
        with self._write(fenced=True) as conn:
            self._step_row(conn, record.id, state, "finished", event, result, now_ns)
            conn.execute(
                P.update()
                .where(P.c.id == record.id, P.c.state == str(state), P.c.status == ex.ACTIVE)
                .values(
                    state=str(next_state),
                    status=status,
                    approved_step=None,
                    updated_ns=now_ns,
                    epoch=self.fence.epoch if self.fence else 0,
                )
            )
            self._audit(
                conn,
                now_ns,
                "step.finished",
                f"policy:{record.tier}",
                subject=f"plan {record.id} {state}",
                why={"incident": record.plan.incident_id},
                result={
                    "event": str(event),
                    "next": str(next_state),
                    "status": status,
                    "detail": result.get("detail") or result.get("error"),
                    "changed": result.get("changed"),
                    # what a remote party (a webhook receiver) answered, as it answered it
                    "answer": (result.get("record") or {}).get("answer"),
                },
            )

    def wait(self, record: ex.PlanRecord, status: str, kind: str, reason: str, now_ns: int) -> None:
        with self._write(fenced=True) as conn:
            done = conn.execute(
                P.update()
                .where(P.c.id == record.id, P.c.status == ex.ACTIVE)
                .values(status=status, note=reason, updated_ns=now_ns)
            )
            if done.rowcount:
                self._audit(
                    conn,
                    now_ns,
                    kind,
                    f"policy:{record.tier}",
                    subject=f"plan {record.id} {record.state}",
                    why={"incident": record.plan.incident_id},
                    result={"reason": reason},
                )

    def guard_tripped(self, pool: str | None) -> str | None:
        g = s.remediation_guards
        with self.db.system_tx() as conn:
            return conn.execute(
                sa.select(g.c.reason).where(g.c.tenant == self.tenant, g.c.pool == (pool or ""))
            ).scalar()

    def trip_guard(self, pool: str | None, reason: str, now_ns: int) -> None:
        g = s.remediation_guards
        with self._write(fenced=True) as conn:
            found = conn.execute(
                sa.select(g.c.pool).where(g.c.tenant == self.tenant, g.c.pool == (pool or ""))
            ).first()
            if found is None:
                conn.execute(
                    g.insert().values(
                        tenant=self.tenant, pool=pool or "", tripped_ns=now_ns, reason=reason
                    )
                )

    def _finished(self, state: State, since_ns: int, pool: str | None) -> Any:
        query = (
            sa.select(ST.c.ts_ns, P.c.host)
            .join(P, P.c.id == ST.c.plan_id)
            .where(
                ST.c.tenant == self.tenant,
                ST.c.state == str(state),
                ST.c.phase == "finished",
                ST.c.event == str(Event.OK),
                ST.c.ts_ns >= since_ns,
            )
        )
        return query.where(P.c.pool == pool) if pool is not None else query

    def cordons(self, pool: str | None, since_ns: int) -> Sequence[int]:
        with self.db.system_tx() as conn:
            return [
                int(r.ts_ns) for r in conn.execute(self._finished(State.CORDON, since_ns, pool))
            ]

    def unhealthy_hosts(self, pool: str | None) -> set[str]:
        """Hosts of the pool we cordoned whose plan has not given them back (resumed)."""
        with self.db.system_tx() as conn:
            cordoned = {r.host for r in conn.execute(self._finished(State.CORDON, 0, pool))}
            resumed = {r.host for r in conn.execute(self._finished(State.RESUME, 0, pool))}
        return cordoned - resumed

    def backend_ops(self, since_ns: int) -> Sequence[int]:
        with self.db.system_tx() as conn:
            return list(
                conn.execute(
                    sa.select(ST.c.ts_ns).where(ST.c.phase == "started", ST.c.ts_ns >= since_ns)
                ).scalars()
            )

    def host_incidents(self, host: str, since_ns: int) -> Sequence[int]:
        inc, links = s.incidents, s.incident_links
        with self.db.tenant_tx(self.tenant) as conn:
            return list(
                conn.execute(
                    sa.select(inc.c.opened_ns).where(
                        inc.c.tenant == self.tenant,
                        inc.c.opened_ns >= since_ns,
                        inc.c.id.in_(
                            sa.select(links.c.incident_id).where(
                                links.c.tenant == self.tenant,
                                links.c.kind == "host",
                                links.c.ref == host,
                            )
                        ),
                    )
                ).scalars()
            )

    # --- humans: reading and deciding ---------------------------------------------------------

    def plans(
        self, *, status: str | None = None, incident: int | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        query = sa.select(P).where(P.c.tenant == self.tenant)
        if status is not None:
            query = query.where(P.c.status == status)
        if incident is not None:
            query = query.where(P.c.incident_id == incident)
        with self.db.system_tx() as conn:
            rows = conn.execute(query.order_by(P.c.id.desc()).limit(limit)).all()
        return [plan_dict(row, None) for row in rows]

    def plan(self, plan_id: int) -> dict[str, Any]:
        with self.db.system_tx() as conn:
            return self._plan(conn, plan_id)

    def _plan(self, conn: Connection, plan_id: int) -> dict[str, Any]:
        row = conn.execute(sa.select(P).where(P.c.tenant == self.tenant, P.c.id == plan_id)).first()
        if row is None:
            raise NotFound(f"no remediation plan {plan_id}")
        steps = conn.execute(sa.select(ST).where(ST.c.plan_id == plan_id).order_by(ST.c.seq)).all()
        return plan_dict(row, steps)

    def approve(self, plan_id: int, who: str, now_ns: int) -> dict[str, Any]:
        """A named human approves the step the plan waits at (or a held one); it runs once."""
        with self._write(fenced=False) as conn:
            plan = self._plan(conn, plan_id)
            if plan["status"] == ex.RECOMMENDED or plan["status"] == ex.OBSERVED:
                raise Conflict(
                    f"plan {plan_id} is {plan['status']} (tier {plan['tier']}): nothing runs "
                    "under that tier; raise the policy's tier to approve"
                )
            if plan["status"] not in (ex.WAITING, ex.HELD):
                raise Conflict(f"plan {plan_id} is {plan['status']}: nothing waits for approval")
            conn.execute(
                P.update()
                .where(P.c.id == plan_id, P.c.status == plan["status"])
                .values(
                    status=ex.ACTIVE,
                    approved_step=plan["state"],
                    decided_by=who,
                    note="",
                    updated_ns=now_ns,
                )
            )
            self._audit(
                conn,
                now_ns,
                "plan.approved",
                who,
                subject=f"plan {plan_id} {plan['state']}",
                why={"incident": plan["incident"], "held": plan["note"]},
                result={"step": plan["state"]},
            )
            return self._plan(conn, plan_id)

    def reject(self, plan_id: int, who: str, note: str, now_ns: int) -> dict[str, Any]:
        with self._write(fenced=False) as conn:
            plan = self._plan(conn, plan_id)
            if info(State(plan["state"])).terminal:
                raise Conflict(f"plan {plan_id} has ended ({plan['state']})")
            conn.execute(
                P.update()
                .where(P.c.id == plan_id)
                .values(
                    state=str(State.REJECTED),
                    status=ex.REJECTED,
                    decided_by=who,
                    note=note,
                    updated_ns=now_ns,
                )
            )
            self._audit(
                conn,
                now_ns,
                "plan.rejected",
                who,
                subject=f"plan {plan_id} {plan['state']}",
                why={"incident": plan["incident"]},
                result={"note": note},
            )
            return self._plan(conn, plan_id)

    def reset_guard(self, pool: str | None, who: str, now_ns: int) -> bool:
        g = s.remediation_guards
        with self._write(fenced=False) as conn:
            done = conn.execute(
                g.delete().where(g.c.tenant == self.tenant, g.c.pool == (pool or ""))
            )
            if done.rowcount:
                self._audit(conn, now_ns, "guard.reset", who, subject=f"pool {pool or '-'}")
            return bool(done.rowcount)

    def guards(self) -> list[dict[str, Any]]:
        g = s.remediation_guards
        with self.db.system_tx() as conn:
            rows = conn.execute(sa.select(g).where(g.c.tenant == self.tenant)).all()
        return [
            {"pool": r.pool or None, "tripped_ns": r.tripped_ns, "reason": r.reason} for r in rows
        ]


def plan_dict(row: Any, steps: Sequence[Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": int(row.id),
        "incident": int(row.incident_id),
        "host": row.host,
        "pool": row.pool,
        "plan": jsonio.loads(row.plan),
        "tier": row.tier,
        "state": row.state,
        "status": row.status,
        "approved_step": row.approved_step,
        "decided_by": row.decided_by,
        "note": row.note,
        "created_ns": row.created_ns,
        "updated_ns": row.updated_ns,
    }
    if steps is not None:
        out["steps"] = [
            {
                "seq": r.seq,
                "state": r.state,
                "phase": r.phase,
                "event": r.event,
                "result": jsonio.loads(r.result),
                "ts_ns": r.ts_ns,
                "epoch": r.epoch,
            }
            for r in steps
        ]
    return out
