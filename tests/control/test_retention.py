"""Retention: evidence by age (PostgreSQL drops whole day partitions) and by size per
tenant, run by the leader behind its fence; incidents and reports stay."""

from __future__ import annotations

import sqlalchemy as sa

from denpex.control.retention import (
    DAY_NS,
    RetentionPolicy,
    apply_retention,
    ensure_partitions,
    partition_name,
)
from tests.control.helpers import T0, evidence, logs_body, report

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def ids(api, tenant: str) -> set[str]:
    with api.runtime.db.tenant_tx(tenant) as conn:
        query = sa.text("SELECT id FROM evidence WHERE tenant = :t")
        return set(conn.execute(query, {"t": tenant}).scalars())


def test_age_and_size(api):
    if api.runtime.db.postgres:
        ensure_partitions(api.runtime.db, T0 - 10 * DAY_NS, T0 + DAY_NS)
    for day in range(10):
        items = evidence(3, host="n1", prefix=f"d{day}", ts=T0 - (9 - day) * DAY_NS)
        assert api.post("/v1/logs", content=logs_body(items), headers=PROTOBUF).status_code == 200
        other = evidence(1, host="n1", prefix=f"b{day}", ts=T0 - (9 - day) * DAY_NS)
        api.post("/v1/logs", content=logs_body(other), headers=PROTOBUF, tenant="blue")
    api.post("/api/v1/reports", json=report(ended_ns=T0 - 20 * DAY_NS, timeline=False))
    api.tick()  # leader at an epoch, incidents opened (the job's, the fleet rules')
    before = len(api.get("/api/v1/incidents").json()["items"])
    lead = api.runtime.leadership
    store = api.runtime.store
    removed = apply_retention(
        store,
        lambda t: store.for_leader(t, lead.fence),
        RetentionPolicy(max_age_days=5, max_rows_per_tenant=9),
        T0 + DAY_NS // 2,
    )
    kept = ids(api, "acme")
    # age: days 0..4 (ts older than T0 - 4.5 days) are gone; size: 9 newest of the rest
    old = {f"d{d}-n1-{i}" for d in range(5) for i in range(3)}
    assert not kept & old
    assert kept == {f"d{d}-n1-{i}" for d in (7, 8, 9) for i in range(3)}
    assert ids(api, "blue") == {f"b{d}-n1-0" for d in range(5, 10)}
    # rows deleted one by one; PostgreSQL's whole-partition drops are not counted
    assert removed >= (1 if api.runtime.db.postgres else 15 + 5)
    assert before >= 1
    assert len(api.get("/api/v1/incidents").json()["items"]) == before  # incidents stay
    if api.runtime.db.postgres:
        with api.runtime.db.system_tx() as conn:
            names = set(
                conn.execute(
                    sa.text(
                        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = "
                        "i.inhrelid JOIN pg_class p ON p.oid = i.inhparent "
                        "WHERE p.relname = 'evidence'"
                    )
                ).scalars()
            )
        assert partition_name(T0 - 9 * DAY_NS) not in names  # dropped whole
        assert partition_name(T0) in names and "evidence_default" in names
        assert partition_name(T0 + 2 * DAY_NS) in names  # created ahead
