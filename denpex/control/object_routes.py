"""The routes that serve the object store's artefacts: a job report as it was received
(GET /api/v1/reports/{id}/archive, jobs:read) and an incident's evidence bundle
(GET /api/v1/incidents/{id}/bundle, evidence:read: built and stored on first request, then
served from the store), plus the archiving step of report ingest.

Each route is decided by the policy set like every other (one Decides) and reaches objects
only through `objects.scoped(principal)`: another tenant's id answers 404, as in the store.
An object-store failure answers 503 with what to do, never a traceback.
"""

# No `from __future__ import annotations`: FastAPI reads the route signatures at run time.
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, FastAPI, Path, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from denpex.control.objects import ObjectError, ObjectInfo, ObjectStore, TenantObjects
from denpex.control.objects.bundle import store_bundle
from denpex.control.store import NotFound, Store
from denpex.enterprise import Principal


def archive_report(objects: TenantObjects, report_id: str, raw: bytes, new: bool) -> None:
    """Keep the report's raw JSON; a redelivered report is archived only if the first
    delivery's archive is missing (the database row and the archive may have parted)."""
    if new or not objects.exists("reports", report_id):
        objects.put("reports", report_id, raw, "application/json")


def _headers(info: ObjectInfo, filename: str | None = None) -> dict[str, str]:
    out = {"X-Denpex-Sha256": info.sha256, "ETag": f'"{info.sha256}"'}
    if filename:
        out["Content-Disposition"] = f'attachment; filename="{filename}"'
    return out


def add_object_routes(
    app: FastAPI, store: Store, objects: ObjectStore, principal: Callable[[str], object]
) -> None:
    @app.exception_handler(ObjectError)
    def _object_error(_request: Request, exc: ObjectError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.get(
        "/api/v1/reports/{report_id}/archive",
        tags=["jobs"],
        summary="a job report exactly as POST /api/v1/reports received it",
        response_class=Response,
    )
    def get_report_archive(
        who: Annotated[Principal, Depends(principal("jobs:read"))], report_id: str
    ) -> Response:
        mine = objects.scoped(who)
        try:
            store.scoped(who).report(report_id)  # the tenant's report, or 404
        except NotFound:
            raise NotFound("no such report") from None  # the id sits in the URL already
        data, info = mine.get("reports", report_id)
        return Response(data, media_type="application/json", headers=_headers(info))

    @app.get(
        "/api/v1/incidents/{incident_id}/bundle",
        tags=["incidents"],
        summary="the incident's evidence bundle (tar.gz: incident, evidence, reports, manifest)",
        response_class=Response,
    )
    async def get_incident_bundle(
        who: Annotated[Principal, Depends(principal("evidence:read"))],
        incident_id: Annotated[int, Path(ge=1)],
    ) -> Response:
        mine = objects.scoped(who)
        stored = await run_in_threadpool(store_bundle, store.scoped(who), mine, incident_id)
        data, info = await run_in_threadpool(mine.get, "bundles", stored.name)
        headers = {**_headers(info, stored.name), "X-Denpex-Object": stored.ref}
        return Response(data, media_type="application/gzip", headers=headers)
