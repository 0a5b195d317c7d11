"""An incident's evidence bundle: one tar.gz with the incident as the API shows it, each piece
of its evidence, each job report it names (the archived raw JSON where the store has it) and
a manifest of every member's SHA-256, stored once per incident state in the tenant's objects
(bundles/incident-<id>-<updated_ns>.tar.gz). The same incident state always gives the same
bytes (sorted members, fixed times), so a rebuild after a lost object hashes the same.

It reads only through the tenant's own store and objects; it must never name a row of another
tenant (the TenantStore it is given cannot).
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from denpex.control.objects import ObjectInfo, ObjectNotFound, TenantObjects
from denpex.control.objects.model import settings, sha256_of
from denpex.control.store import NotFound

FORMAT = "denpex.bundle/v1"


class IncidentReader(Protocol):
    """What of a control.store.TenantStore the bundle reads."""

    tenant: str

    def incident(self, incident_id: int) -> dict[str, Any]: ...

    def evidence(self, evidence_id: str) -> dict[str, Any]: ...

    def report(self, report_id: str) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class StoredBundle:
    name: str  # within the tenant's bundles
    info: ObjectInfo
    built: bool  # False: this incident state's bundle was already stored

    @property
    def ref(self) -> str:
        """How a notice names it (kind/name)."""
        return f"bundles/{self.name}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "sha256": self.info.sha256, "size": self.info.size}


def _json(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, indent=2, default=str).encode() + b"\n"


def build_bundle(
    store: IncidentReader, objects: TenantObjects, incident: Mapping[str, Any]
) -> bytes:
    """The bundle's bytes for this state of the incident (as store.incident returned it)."""
    incident_id = int(incident["id"])
    files: dict[str, bytes] = {"incident.json": _json(incident)}
    limit = int(settings()["bundle_max_evidence"])
    evidence_ids = list(incident.get("evidence") or [])
    missing: list[str] = []
    for evidence_id in evidence_ids[:limit]:
        try:
            files[f"evidence/{_member(evidence_id)}.json"] = _json(store.evidence(evidence_id))
        except NotFound:
            missing.append(evidence_id)  # aged out by retention since the incident opened
    for report_id in incident.get("reports") or []:
        try:
            raw, _ = objects.get("reports", report_id)  # as ingested, byte for byte
        except ObjectNotFound:
            raw = _json(store.report(report_id))  # stored before reports were archived
        files[f"reports/{_member(report_id)}.json"] = raw
    manifest = {
        "format": FORMAT,
        "tenant": store.tenant,
        "incident": incident_id,
        "updated_ns": incident.get("updated_ns"),
        "evidence_left_out": evidence_ids[limit:],
        "evidence_expired": missing,
        "files": {n: {"sha256": sha256_of(b), "size": len(b)} for n, b in sorted(files.items())},
    }
    files["manifest.json"] = _json(manifest)
    mtime = int(incident.get("updated_ns") or 0) // 1_000_000_000
    raw_tar = io.BytesIO()
    with tarfile.open(fileobj=raw_tar, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(files):
            member = tarfile.TarInfo(f"incident-{incident_id}/{name}")
            member.size, member.mtime, member.mode = len(files[name]), mtime, 0o644
            tar.addfile(member, io.BytesIO(files[name]))
    return gzip.compress(raw_tar.getvalue(), mtime=0)


def _member(ref: str) -> str:
    """An id as one file name inside the tar, percent-encoded: ids may hold '/', and two ids
    never share a name."""
    return quote(ref, safe="")


def bundle_name(incident: Mapping[str, Any]) -> str:
    return f"incident-{incident['id']}-{incident.get('updated_ns') or 0}.tar.gz"


def store_bundle(store: IncidentReader, objects: TenantObjects, incident_id: int) -> StoredBundle:
    """The stored bundle of the incident's current state, built and put when missing."""
    incident = store.incident(incident_id)
    name = bundle_name(incident)
    try:
        return StoredBundle(name, objects.head("bundles", name), built=False)
    except ObjectNotFound:
        pass
    data = build_bundle(store, objects, incident)
    return StoredBundle(name, objects.put("bundles", name, data, "application/gzip"), built=True)


def read_members(data: bytes) -> dict[str, bytes]:
    """A bundle's members by name (tests, `denpex` tooling that unpacks one)."""
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            handle = tar.extractfile(member)
            if handle is not None:
                out[member.name.split("/", 1)[1]] = handle.read()
    return out
