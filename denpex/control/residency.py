"""Regions and tenant residency (`denpex server --region NAME --regions FILE`): which
region is the authority for which hosts, the regions each tenant's data may live in, and
where the global read view lives. One check, at ingest, for every path (HTTP and the
JetStream bus): a tenant not resident in this region, or a payload naming a host of another
region, is refused (403) and written to the audit log, and nothing of it is stored.

The regions file (YAML):
    regions:                    # every region and the host names it is the authority for
      eu: {hosts: ["eu-*", "fra*"]}
      us: {hosts: ["us-*"]}
    tenants:                    # residency: the regions a tenant's data may live in
      acme: [eu]
      globex: [eu, us]
    default_residency: []       # a tenant not listed: [] = nowhere (refused everywhere)
    global: {region: us}        # where the global read view is; only tenants resident
                                # there are replicated to it (denpex.control.global_view)
Host patterns are fnmatch globs; a host that matches no region's pattern is refused too (no
region is its authority). Pure apart from `audit_refusal`; it must never let a refused
payload be stored.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from denpex.control import audit_log
from denpex.control.db import Database
from denpex.control.ingest import IngestError, LogBatch, Report
from denpex.enterprise import Principal


@dataclass(frozen=True, slots=True)
class Residency:
    region: str  # this server's region
    hosts: Mapping[str, tuple[str, ...]]  # region → host patterns
    tenants: Mapping[str, frozenset[str]]  # tenant → the regions its data may live in
    default: frozenset[str] = frozenset()
    global_region: str | None = None
    _cache: dict[str, str | None] = field(default_factory=dict, compare=False, repr=False)

    def allowed(self, tenant: str) -> frozenset[str]:
        return self.tenants.get(tenant, self.default)

    def resident_here(self, tenant: str) -> bool:
        return self.region in self.allowed(tenant)

    def global_tenants(self) -> list[str]:
        """The tenants whose rows may reach the global read view (sorted)."""
        if self.global_region is None:
            return []
        return sorted(t for t, regions in self.tenants.items() if self.global_region in regions)

    def region_of(self, host: str) -> str | None:
        """The region that is the authority for `host` (this one first), or None."""
        if host not in self._cache:
            found = [
                region
                for region, patterns in self.hosts.items()
                if any(fnmatch.fnmatchcase(host, p) for p in patterns)
            ]
            owner: str | None = self.region if self.region in found else None
            if owner is None and found:
                owner = found[0]
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[host] = owner
        return self._cache[host]

    def check(self, tenant: str, hosts: Iterable[str | None]) -> None:
        """IngestError 403 unless `tenant` may live here and every host is this region's."""
        if not self.resident_here(tenant):
            allowed = ", ".join(sorted(self.allowed(tenant))) or "none"
            raise IngestError(
                403,
                f"tenant {tenant!r} may not store data in region {self.region!r} "
                f"(its residency: {allowed})",
            )
        for host in hosts:
            if host is None:
                continue
            owner = self.region_of(host)
            if owner != self.region:
                where = f"region {owner!r}" if owner else "no region"
                raise IngestError(403, f"host {host!r} belongs to {where}, not to {self.region!r}")

    def check_batch(self, tenant: str, batch: LogBatch) -> None:
        self.check(tenant, {row[4] for row in batch.rows} | set(batch.hosts))

    def check_metrics(self, tenant: str, rows: list[tuple[Any, ...]]) -> None:
        self.check(tenant, {row[1] or None for row in rows})

    def check_report(self, tenant: str, report: Report) -> None:
        hosts = set(report.hosts) | {g["host"] for g in report.gpus}
        self.check(tenant, hosts | {row[4] for row in report.evidence.rows})


def parse_residency(region: str, data: Any) -> Residency:
    """The Residency of `region` from the regions file's parsed YAML; ValueError if bad."""
    if not isinstance(data, dict) or not isinstance(data.get("regions"), dict):
        raise ValueError("a regions file needs `regions: {NAME: {hosts: [PATTERN, …]}}`")
    hosts: dict[str, tuple[str, ...]] = {}
    for name, spec in data["regions"].items():
        check_region_name(str(name))
        patterns = spec.get("hosts") if isinstance(spec, dict) else None
        if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
            raise ValueError(f"regions.{name}.hosts: a list of host name patterns")
        hosts[str(name)] = tuple(patterns)
    if region not in hosts:
        raise ValueError(f"--region {region!r} is not in the regions file ({', '.join(hosts)})")
    tenants: dict[str, frozenset[str]] = {}
    for tenant, regions in (data.get("tenants") or {}).items():
        tenants[str(tenant)] = _regions(regions, f"tenants.{tenant}", hosts)
    default = _regions(data.get("default_residency") or [], "default_residency", hosts)
    global_spec = data.get("global")
    global_region = None
    if global_spec is not None:
        global_region = global_spec.get("region") if isinstance(global_spec, dict) else None
        if global_region not in hosts:
            raise ValueError("global.region: one of the regions")
    return Residency(region, hosts, tenants, default, global_region)


def _regions(value: Any, where: str, known: Mapping[str, Any]) -> frozenset[str]:
    if not isinstance(value, list) or not all(v in known for v in value):
        raise ValueError(f"{where}: a list of regions among {', '.join(known)}")
    return frozenset(str(v) for v in value)


def load_residency(region: str, path: str) -> Residency:
    import yaml

    with open(path, encoding="utf-8") as f:
        return parse_residency(region, yaml.safe_load(f))


def audit_refusal(db: Database, who: Principal | None, what: str, status: int, why: str) -> None:
    """An `ingest.refused` audit record (the reason, never the payload)."""
    with db.system_tx(write=True) as conn:
        audit_log.append(
            conn,
            ts_ns=time.time_ns(),
            kind="ingest.refused",
            actor=who.label if who is not None else "unauthenticated",
            tenant=who.tenant if who is not None else None,
            subject=what,
            why={"status": status, "message": why[:500]},
        )


def claim_region(db: Database, region: str) -> None:
    """This store's rows are `region`'s from now on: the default of the region columns
    (rows written before a region was named keep '': the audit log is never updated)."""
    if not db.postgres:
        return  # the global view is PostgreSQL's logical replication; nothing to mark
    with db.system_tx(write=True) as conn:
        for table in ("incidents", "audit"):
            conn.execute(
                sa.text(f"ALTER TABLE {table} ALTER COLUMN region SET DEFAULT {_literal(region)}")
            )


def check_region_name(text: str) -> str:
    """A region name is used in SQL and publication names: lower letters, digits and _."""
    if not text or not all(c.isdigit() or c == "_" or "a" <= c <= "z" for c in text):
        raise ValueError(f"region name {text!r}: lower-case letters, digits and _ only")
    return text


def _literal(text: str) -> str:
    return "'" + check_region_name(text) + "'"
