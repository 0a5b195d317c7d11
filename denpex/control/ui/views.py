"""What each page shows, gathered from one TenantStore: the fleet (hosts, their states and
open incidents, the warm spares and their last preflight), an incident (its reports' diagnoses, evidence, jobs, host history) and jobs.

Pure reads through the TenantStore the caller obtained from an authenticated Principal;
it must never invent a state the store does not hold (see host_states.yaml).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from denpex.control.store import NotFound, Page, TenantStore, decode_cursor
from denpex.control.timefmt import iso
from denpex.core.taxonomy import load_taxonomy

ACTIVE = ("open", "acknowledged")
MAX_HOSTS = 5000  # the fleet page reads at most this many hosts
MAX_ACTIVE = 500  # ... and this many open or acknowledged incidents
MAX_EVIDENCE = 300  # evidence rows an incident page lists
MAX_REPORTS = 5  # reports of one incident whose diagnosis the page reads
LAYERS = {0: "log", 1: "kernel", 2: "GPU", 3: "fabric", 4: "SDK"}


@cache
def host_states() -> dict[str, dict[str, Any]]:
    text = resources.files("denpex.control.ui").joinpath("host_states.yaml").read_text()
    return dict(yaml.safe_load(text))


def layer_of(category: str | None) -> str:
    """The layer (log, kernel, GPU, fabric, SDK) the taxonomy gives a category."""
    return LAYERS.get(load_taxonomy().layer(category or ""), "log")


@dataclass(slots=True)
class HostCell:
    name: str
    state: str
    last: str | None
    incidents: list[int] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    plan: int | None = None  # the remediation plan that set a remediation state
    step: str | None = None  # ... and its step that did
    spare: str | None = None  # its status in the warm-spare pool, when it is a spare


@dataclass(slots=True)
class Group:
    name: str  # the rack, switch or pool (or why there is none)
    cells: list[HostCell]
    counts: dict[str, int]  # state → hosts of this group in it (only states present)


@dataclass(slots=True)
class Fleet:
    groups: list[Group]
    active: list[dict[str, Any]]
    counts: dict[str, int | None]
    total: int
    shown: int
    categories: list[str]
    fleet_findings: list[dict[str, Any]]
    group_by: str
    topology_hosts: int  # hosts the site topology places (0: none given)
    spares: list[dict[str, Any]] = field(default_factory=list)  # the warm-spare pool


GROUP_BY = ("rack", "switch", "pool")


def state_of_step() -> dict[str, str]:
    """Plan step → the host state it leaves (host_states.yaml's remediation states)."""
    return {step: key for key, spec in host_states().items() for step in spec.get("steps") or ()}


def state_of_spare() -> dict[str, str]:
    """Spare status → the host state it shows (host_states.yaml's spare states)."""
    return {st: key for key, spec in host_states().items() for st in spec.get("statuses") or ()}


def fleet(
    store: TenantStore,
    *,
    state: str | None,
    category: str | None,
    text: str | None,
    remediation: Mapping[str, Mapping[str, Any]] | None = None,
    placements: Mapping[str, Any] | None = None,
    group_by: str = "rack",
    spares: list[dict[str, Any]] | None = None,
) -> Fleet:
    """Every host as a cell (filtered by state, open-incident category and name text) in
    groups by rack, leaf switch or pool of the site topology, the active incidents newest
    first, and the count of hosts in each state. `remediation` is host → {state, plan, step}
    (actions.remediation_states); `placements` host → Placement (the fleet rules' topology);
    `spares` the warm-spare pool (SpareStore.spares): a spare that never reported has a cell."""
    remediation = remediation or {}
    spares = spares or []
    as_spare = state_of_spare()
    spare_of = {sp["host"]: sp for sp in spares if sp["status"] in as_spare}
    placements = placements or {}
    group_by = group_by if group_by in GROUP_BY else "rack"
    hosts = all_hosts(store)
    reported = {h["name"] for h in hosts}
    hosts += [{"name": h, "last_ns": None} for h in sorted(spare_of) if h not in reported]
    active: list[dict[str, Any]] = []
    for status in ACTIVE:
        active += store.incidents(status=status, limit=MAX_ACTIVE).items
    active.sort(key=lambda i: (i["last_ns"], i["id"]), reverse=True)
    active = active[:MAX_ACTIVE]
    on_host: dict[str, list[dict[str, Any]]] = {}
    for incident in active:
        incident["hosts"] = store.incident(incident["id"])["hosts"]
        for host in incident["hosts"]:
            on_host.setdefault(host, []).append(incident)
    cells = []
    for host in hosts:
        mine = on_host.get(host["name"], [])
        held = remediation.get(host["name"]) or {}
        spare = spare_of.get(host["name"])
        cells.append(
            HostCell(
                name=host["name"],
                state=held.get("state")
                or (as_spare[spare["status"]] if spare else None)
                or ("suspect" if mine else "healthy"),
                last=iso(host["last_ns"]),  # None: a spare that never reported
                incidents=[i["id"] for i in mine],
                categories=sorted({i["category"] for i in mine}),
                plan=held.get("plan"),
                step=held.get("step"),
                spare=spare["status"] if spare else None,
            )
        )
    states = host_states()
    counts: dict[str, int | None] = {
        key: (sum(c.state == key for c in cells) if spec["tracked"] else None)
        for key, spec in states.items()
    }
    needle = (text or "").strip().lower()
    shown = [
        c
        for c in cells
        if (not state or c.state == state)
        and (not category or category in c.categories)
        and (not needle or needle in c.name.lower())
    ]
    if category:
        active = [i for i in active if i["category"] == category]
    return Fleet(
        groups=_grouped(shown, placements, group_by),
        active=active,
        counts=counts,
        total=len(cells),
        shown=len(shown),
        categories=sorted({i["category"] for i in active} | ({category} if category else set())),
        fleet_findings=[i for i in active if i["rule"] != "job_root_cause"],
        group_by=group_by,
        topology_hosts=len(placements),
        spares=spares,
    )


def _grouped(cells: list[HostCell], placements: Mapping[str, Any], by: str) -> list[Group]:
    if not cells:
        return []
    if not placements:
        return [_group("no site topology given (denpex server --topology FILE)", cells)]
    named: dict[str, list[HostCell]] = {}
    unplaced: list[HostCell] = []
    for cell in cells:
        value = getattr(placements.get(cell.name), by, None)
        if value:
            named.setdefault(f"{by} {value}", []).append(cell)
        else:
            unplaced.append(cell)
    groups = [_group(name, named[name]) for name in sorted(named)]
    if unplaced:
        groups.append(_group(f"no {by} in the site topology", unplaced))
    return groups


def _group(name: str, cells: list[HostCell]) -> Group:
    counts: dict[str, int] = {}
    for cell in cells:
        counts[cell.state] = counts.get(cell.state, 0) + 1
    order = list(host_states())
    return Group(name, cells, dict(sorted(counts.items(), key=lambda kv: order.index(kv[0]))))


def all_hosts(store: TenantStore) -> list[dict[str, Any]]:
    hosts: list[dict[str, Any]] = []
    cursor = None
    while len(hosts) < MAX_HOSTS:
        page = store.hosts(limit=min(1000, MAX_HOSTS - len(hosts)), cursor=cursor)
        hosts += page.items
        if page.next_cursor is None:
            break
        cursor = decode_cursor(page.next_cursor, 1)
    return hosts


@dataclass(slots=True)
class IncidentView:
    incident: dict[str, Any]
    diagnosis: dict[str, Any] | None  # the newest linked report's denpex.diagnosis/v1
    report_id: str | None
    evidence: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    history: list[dict[str, Any]]
    actions: list[dict[str, Any]]


def incident_view(store: TenantStore, incident_id: int) -> IncidentView:
    """Raises NotFound for an id the tenant does not have (another tenant's included)."""
    incident = store.incident(incident_id)
    reports = []
    for report_id in incident["reports"][:MAX_REPORTS]:
        try:
            reports.append(store.report(report_id))
        except NotFound:  # retention may have outlived a report: the incident stays
            continue
    reports.sort(key=lambda r: r["ended_ns"], reverse=True)
    primary = reports[0] if reports else None
    diagnosis = primary["diagnosis"] if primary else None
    timeline = {
        f"{r['id']}/{e.get('id')}": e
        for r in reports
        for e in r["diagnosis"].get("timeline") or []
        if isinstance(e, dict)
    }
    # the incident's own links, then the rest of its newest report's timeline (the swim
    # lanes show every entry; each marker links to its row)
    ids = list(incident["evidence"])
    if primary:
        linked = set(ids)
        ids += [k for k in timeline if k.startswith(primary["id"] + "/") and k not in linked]
    evidence = []
    for evidence_id in ids[:MAX_EVIDENCE]:
        try:
            row = store.evidence(evidence_id)
        except NotFound:  # aged out by retention
            continue
        entry = timeline.get(evidence_id, {})
        row["file_line"] = _file_line(entry, row)
        row["role"] = entry.get("role") or row["attrs"].get("role") or "related"
        row["layer"] = layer_of(row["category"])
        row["local_id"] = (
            evidence_id.split("/", 1)[1]
            if primary and evidence_id.startswith(primary["id"] + "/")
            else None
        )
        evidence.append(row)
    evidence.sort(key=lambda r: (r["ts_ns"], r["id"]))
    history = []
    root_host = (diagnosis or {}).get("root_cause", {}).get("host")
    hosts = sorted(incident["hosts"], key=lambda h: (h != root_host, h))  # the culprit first
    for host in hosts[:3]:
        try:
            found = store.host(host, since=None, until=None, limit=20)
        except NotFound:
            continue
        history.append(
            {
                "name": host,
                "incidents": [i for i in found["incidents"] if i["id"] != incident_id],
                "jobs": found["jobs"],
            }
        )
    actions = [a for a in (diagnosis or {}).get("actions") or [] if isinstance(a, dict)]
    if not actions:  # evidence from agents carries its own suggested action
        seen = {(r["action"], r["host"]) for r in evidence if r["action"] not in ("", "none")}
        actions = [
            {"action": a, "target": h, "reason": "suggested by the evidence"} for a, h in seen
        ]
    return IncidentView(
        incident=incident,
        diagnosis=diagnosis,
        report_id=primary["id"] if primary else None,
        evidence=evidence,
        jobs=reports,
        history=history,
        actions=actions,
    )


def _file_line(entry: dict[str, Any], row: dict[str, Any]) -> str:
    """`file:line` of an evidence row: from its report's timeline entry, else from the
    attributes an agent sent; '' when neither knows."""
    for source in (entry, row.get("attrs") or {}):
        path, line = source.get("file"), source.get("lineno") or source.get("line_no")
        if path and isinstance(line, int):
            return f"{path}:{line}"
        if path:
            return str(path)
    return ""


JOB_FILTERS = ("job", "user", "category", "host")


def jobs_page(store: TenantStore, filters: dict[str, str], cursor: tuple[Any, ...] | None) -> Page:
    """Recent job reports, newest first, by exact job id, user, category and host; a failed
    one carries the id of the newest incident that names its job (None before correlation)."""
    given = {k: filters.get(k, "").strip() or None for k in JOB_FILTERS}
    found = store.jobs(
        job=given["job"],
        user=given["user"],
        category=given["category"],
        host=given["host"],
        limit=50,
        cursor=cursor,
    )
    for item in found.items:
        linked = store.incidents(job=item["job"] or item["id"], limit=1).items
        item["incident"] = linked[0]["id"] if item["status"] == "failed" and linked else None
    return found
