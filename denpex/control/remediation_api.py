"""The remediation routes of the REST API (/api/v1/remediation/...): plans and their step
records, dry-run of an incident under the tenant's policy, approve and reject and the guards'
reset (remediation:decide: approver and admin in the bundled policy set; every decision names
the human), the policy (tenant:admin), the warm-spare pool (remediation:spares: add a host,
give one back; the leader holds it out of service and runs its preflight); reads are
remediation:read.

Like every route, each depends on one Decides (control/access.py) naming its action and
reaches storage only through the principal's tenant. It must never run a backend operation
itself: only the leader's executor does.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import time
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Path, Query
from fastapi.responses import JSONResponse

from denpex.control.access import Decides
from denpex.control.db import Database
from denpex.control.remediation_store import RemediationStore
from denpex.control.spare_store import SpareStore
from denpex.control.store import Store
from denpex.enterprise import Principal
from denpex.remediation.executor import dry_run
from denpex.remediation.plan import derive_plans, proposals_of
from denpex.remediation.policy import PolicyError

Requires = Callable[[str], Decides]  # an action → the route's one policy decision


def decider(who: Principal, by: str | None) -> str:
    """The name a decision is recorded under: the human the caller names, and its token
    (token:<id>, or oidc:<sub> for an OIDC caller)."""
    return f"{by} via {who.label}" if by else who.label


def add_routes(app: FastAPI, db: Database, store: Store, principal: Requires) -> None:
    def rs(who: Principal) -> RemediationStore:
        return RemediationStore.scoped(db, who)

    @app.get("/api/v1/remediation/plans", tags=["remediation"])
    def list_plans(
        who: Annotated[Principal, Depends(principal("remediation:read"))],
        status: Annotated[str | None, Query()] = None,
        incident: Annotated[int | None, Query(ge=1)] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> JSONResponse:
        return JSONResponse({"items": rs(who).plans(status=status, incident=incident, limit=limit)})

    @app.get("/api/v1/remediation/plans/{plan_id}", tags=["remediation"])
    def get_plan(
        who: Annotated[Principal, Depends(principal("remediation:read"))],
        plan_id: Annotated[int, Path(ge=1)],
    ) -> JSONResponse:
        return JSONResponse(rs(who).plan(plan_id))

    @app.post("/api/v1/remediation/plans/{plan_id}/approve", tags=["remediation"])
    def approve(
        who: Annotated[Principal, Depends(principal("remediation:decide"))],
        plan_id: Annotated[int, Path(ge=1)],
        body: Annotated[dict[str, Any] | None, Body()] = None,
    ) -> JSONResponse:
        by = (body or {}).get("by")
        return JSONResponse(rs(who).approve(plan_id, decider(who, by), time.time_ns()))

    @app.post("/api/v1/remediation/plans/{plan_id}/reject", tags=["remediation"])
    def reject(
        who: Annotated[Principal, Depends(principal("remediation:decide"))],
        plan_id: Annotated[int, Path(ge=1)],
        body: Annotated[dict[str, Any] | None, Body()] = None,
    ) -> JSONResponse:
        data = body or {}
        note = str(data.get("note") or "")
        done = rs(who).reject(plan_id, decider(who, data.get("by")), note, time.time_ns())
        return JSONResponse(done)

    @app.get("/api/v1/remediation/dry-run/{incident_id}", tags=["remediation"])
    def dry(
        who: Annotated[Principal, Depends(principal("remediation:read"))],
        incident_id: Annotated[int, Path(ge=1)],
    ) -> JSONResponse:
        mine = rs(who)
        incident = store.scoped(who).incident(incident_id)
        proposals = proposals_of(
            incident, mine.incident_evidence(incident_id), mine.diagnosis_actions(incident)
        )
        policy = mine.policy()
        plans = [
            dry_run(p, str(incident.get("rule", "")), policy)
            for p in derive_plans(incident, proposals, pool_of={})
        ]
        return JSONResponse({"incident": incident_id, "policy": policy.digest(), "plans": plans})

    @app.get("/api/v1/remediation/guards", tags=["remediation"])
    def list_guards(
        who: Annotated[Principal, Depends(principal("remediation:read"))],
    ) -> JSONResponse:
        return JSONResponse({"items": rs(who).guards()})

    @app.post("/api/v1/remediation/guards/reset", tags=["remediation"])
    def reset_guard(
        who: Annotated[Principal, Depends(principal("remediation:decide"))],
        body: Annotated[dict[str, Any] | None, Body()] = None,
    ) -> JSONResponse:
        data = body or {}
        pool = data.get("pool")
        done = rs(who).reset_guard(pool, decider(who, data.get("by")), time.time_ns())
        return JSONResponse({"pool": pool, "reset": done})

    @app.get("/api/v1/remediation/policy", tags=["remediation"])
    def get_policy(
        who: Annotated[Principal, Depends(principal("remediation:read"))],
    ) -> JSONResponse:
        policy = rs(who).policy()
        return JSONResponse({"digest": policy.digest(), "policy": dict(policy.raw)})

    @app.put("/api/v1/remediation/policy", tags=["remediation"])
    def put_policy(
        who: Annotated[Principal, Depends(principal("tenant:admin"))],
        body: Annotated[dict[str, Any], Body()],
    ) -> JSONResponse:
        try:
            policy = rs(who).set_policy(body, decider(who, None), time.time_ns())
        except PolicyError as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        return JSONResponse({"digest": policy.digest(), "policy": dict(policy.raw)})

    @app.get("/api/v1/remediation/spares", tags=["remediation"])
    def list_spares(
        who: Annotated[Principal, Depends(principal("remediation:read"))],
    ) -> JSONResponse:
        return JSONResponse({"items": SpareStore.scoped(db, who).spares()})

    @app.get("/api/v1/remediation/spares/{host}", tags=["remediation"])
    def get_spare(
        who: Annotated[Principal, Depends(principal("remediation:read"))],
        host: Annotated[str, Path(min_length=1, max_length=253)],
    ) -> JSONResponse:
        return JSONResponse(SpareStore.scoped(db, who).spare(host))

    @app.post("/api/v1/remediation/spares", tags=["remediation"], status_code=201)
    def add_spare(
        who: Annotated[Principal, Depends(principal("remediation:spares"))],
        body: Annotated[dict[str, Any], Body()],
    ) -> JSONResponse:
        host, pool = body.get("host"), body.get("pool")
        if not isinstance(host, str) or not (pool is None or isinstance(pool, str)):
            return JSONResponse({"error": "give a host (and a pool, or none)"}, status_code=422)
        try:
            done = SpareStore.scoped(db, who).add(
                host, pool, decider(who, body.get("by")), time.time_ns()
            )
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=422)
        return JSONResponse(done, status_code=201)

    @app.delete("/api/v1/remediation/spares/{host}", tags=["remediation"])
    def remove_spare(
        who: Annotated[Principal, Depends(principal("remediation:spares"))],
        host: Annotated[str, Path(min_length=1, max_length=253)],
        by: Annotated[str | None, Query(max_length=200)] = None,
    ) -> JSONResponse:
        return JSONResponse(
            SpareStore.scoped(db, who).remove(host, decider(who, by), time.time_ns())
        )
