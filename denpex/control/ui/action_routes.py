"""The UI's remediation routes: the Actions page (the tenant's plans, each step's state, and
approve / reject forms that do what POST /api/v1/remediation/plans/{id}/approve|reject does)
and the Audit page (the tenant's recent audit records and the verdict on the whole chain).

Each route depends on one PageDecides naming the API route's own action (remediation:read,
remediation:decide, audit:read), so a session may do exactly what its token may do through
the API; a refusal is a 403 in the tenant's denial log. It must never decide a plan without
the session's CSRF token, nor record a decision without naming who made it.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from denpex.control.access import allows
from denpex.control.remediation_api import decider
from denpex.control.remediation_store import RemediationStore
from denpex.control.ui.actions import audit_view, plan_groups
from denpex.control.ui.session import Session, UiError
from denpex.control.ui.views import all_hosts
from denpex.enterprise import Principal

MAX_NAME = 120  # the name a decider types
MAX_NOTE = 2000


@dataclass(frozen=True, slots=True)
class PageKit:
    """What the UI's route modules share (built once by mount_ui)."""

    page: Callable[..., HTMLResponse]
    decides: Callable[..., Any]
    form_of: Callable[[Request], Coroutine[Any, Any, dict[str, str]]]
    guarded: Callable[[Callable[[], Any]], Any]
    session_for: Callable[[Request], Session]
    public: Any  # the dependency of a public page (service:read, for an anonymous caller)
    set_session: Callable[[Response, Request, Session], Response]
    session_of: Callable[[Request], Session | None]


def add_action_routes(app: FastAPI, rt: Any, kit: PageKit) -> None:
    def rs(principal: Principal) -> RemediationStore:
        return RemediationStore.scoped(rt.db, principal)

    @app.get("/actions", include_in_schema=False)
    def actions_page(
        request: Request,
        principal: Annotated[Principal, kit.decides("remediation:read", "hosts:read")],
    ) -> Response:
        session = kit.session_for(request)
        groups = plan_groups(rs(principal))
        known = {h["name"] for h in all_hosts(rt.store.scoped(principal))}
        return kit.page(
            request,
            "actions.html",
            session,
            principal,
            groups=groups,
            total=sum(len(plans) for _key, _heading, plans in groups),
            may_decide=allows(rt, principal, "remediation:decide"),
            known_hosts=known,
        )

    @app.post("/actions/plans/{plan_id}/{verb}", include_in_schema=False)
    async def decide_plan(
        request: Request,
        principal: Annotated[Principal, kit.decides("remediation:decide")],
        plan_id: int,
        verb: str,
    ) -> Response:
        if verb not in ("approve", "reject"):
            raise UiError(404, f"no action {verb!r} on a plan")
        fields = await kit.form_of(request)
        name = fields.get("by", "").strip()[:MAX_NAME]
        if not name:
            raise UiError(400, "say who decides: type your name in the form (it goes in the audit)")
        who = decider(principal, name)
        mine = rs(principal)
        now = time.time_ns()
        if verb == "approve":
            kit.guarded(lambda: mine.approve(plan_id, who, now))
        else:
            note = fields.get("note", "").strip()[:MAX_NOTE]
            kit.guarded(lambda: mine.reject(plan_id, who, note, now))
        wake = getattr(rt, "wake_leader", None)
        if callable(wake):
            wake()  # an approved step runs at the leader's next pass: let it come now
        return RedirectResponse(f"/actions#plan-{plan_id}", status_code=303)

    @app.get("/audit", include_in_schema=False)
    def audit_page(
        request: Request,
        principal: Annotated[Principal, kit.decides("audit:read")],
    ) -> Response:
        session = kit.session_for(request)
        view = audit_view(rt.db, principal.tenant)
        return kit.page(request, "audit.html", session, principal, audit=view)
