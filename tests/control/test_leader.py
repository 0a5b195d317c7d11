"""Leader election and the epoch fence: in-process on both engines, and with two real
`denpex server` replicas on one PostgreSQL (kill -9 the leader; freeze one and let its late
write be refused)."""

from __future__ import annotations

import re
import signal
import time
import urllib.request

import pytest
import sqlalchemy as sa

from denpex.control.correlation import RULE_JOB_ROOT_CAUSE
from denpex.control.db import Database
from denpex.control.leader import Leadership
from denpex.control.store import Fence, Fenced, Store
from tests.control.conftest import ServerProcess, mint
from tests.control.helpers import report

NOW = 1_796_000_000_000_000_000


def candidate(key: str) -> dict:
    return {
        "dedupe_key": key,
        "rule": "test",
        "category": "gpu.xid",
        "component_kind": "host",
        "component_id": "node1",
        "title": "t",
        "explanation": "e",
        "confidence": 0.5,
        "first_ns": NOW,
        "last_ns": NOW,
        "links": {"host": ["node1"]},
    }


def count_incidents(db: Database, tenant: str) -> int:
    with db.tenant_tx(tenant) as conn:
        return conn.execute(sa.text("SELECT count(*) FROM incidents")).scalar()


def test_one_leader_and_a_stale_epoch_is_fenced(db_url):
    db_a, db_b = Database(db_url), Database(db_url)
    db_a.migrate()
    a, b = Leadership(db_a, lease_s=60), Leadership(db_b, lease_s=60)
    try:
        assert a.try_acquire(NOW) and a.state.epoch == 1
        assert not b.try_acquire(NOW)  # lock held, lease fresh
        store = Store(db_a)
        store.for_leader("red", a.fence).record_incidents([candidate("k1")], [], NOW)
        assert count_incidents(db_a, "red") == 1
        a.step_down()
        assert b.try_acquire(NOW) and b.state.epoch == 2
        with pytest.raises(Fenced, match="epoch 1 superseded by 2"):
            store.for_leader("red", Fence("correlator", 1)).record_incidents(
                [candidate("k2")], [], NOW
            )
        assert count_incidents(db_a, "red") == 1  # the refused write stored nothing
        assert not a.renew(NOW) and not a.state.leader
        assert b.renew(NOW)
        with pytest.raises(PermissionError):
            store.for_leader("red", b.fence).__class__(store, "red", None).record_incidents(
                [candidate("k3")], [], NOW
            )
    finally:
        a.step_down()
        b.step_down()
        db_a.dispose()
        db_b.dispose()


def test_an_expired_lease_is_broken_and_the_old_leader_fenced(pg_url):
    db_a, db_b = Database(pg_url), Database(pg_url)
    db_a.migrate()
    a, b = Leadership(db_a, lease_s=5), Leadership(db_b, lease_s=5)
    try:
        assert a.try_acquire(NOW)
        assert not b.try_acquire(NOW + 1_000_000_000)  # within the lease: a keeps it
        assert b.try_acquire(NOW + 6_000_000_000)  # a did not renew for 6 s: its session ends
        assert b.state.epoch == a.state.epoch + 1
        assert not a.renew(NOW + 7_000_000_000)
        assert a.state.fenced == 1 and not a.state.leader
    finally:
        a.step_down()
        b.step_down()
        db_a.dispose()
        db_b.dispose()


def metric(server: ServerProcess, name: str) -> float:
    with urllib.request.urlopen(server.base + "/metrics", timeout=5) as reply:
        text = reply.read().decode()
    match = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def post_report(server: ServerProcess, token: str, body: dict) -> int:
    import orjson

    request = urllib.request.Request(
        server.base + "/api/v1/reports",
        orjson.dumps(body),
        {"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        return reply.status


def incident_epochs(url: str, tenant: str) -> list[int]:
    """The epochs the per-job incidents were written under, in order (the fleet rules may
    add a host incident of their own when two jobs fail on one node)."""
    db = Database(url)
    try:
        with db.tenant_tx(tenant) as conn:
            rows = conn.execute(
                sa.text("SELECT epoch FROM incidents WHERE rule = :rule ORDER BY id"),
                {"rule": RULE_JOB_ROOT_CAUSE},
            )
            return list(rows.scalars())
    finally:
        db.dispose()


@pytest.mark.slow
def test_two_replicas_kill_the_leader_then_freeze_the_next(pg_url, tmp_path, server_processes):
    lease = 3.0
    token = mint(pg_url, "red", "operator")
    replicas = [
        ServerProcess(pg_url, tmp_path / f"server{i}.log", "--lease", str(lease)) for i in (0, 1)
    ]
    server_processes.extend(replicas)
    for replica in replicas:
        replica.start()
    leader = wait_for(
        lambda: next((r for r in replicas if r.health()["leader"]), None), 10, "a leader"
    )
    other = replicas[1 - replicas.index(leader)]
    assert not other.health()["leader"]
    first_epoch = leader.health()["epoch"]
    assert post_report(other, token, report(job="before")) == 201  # any replica ingests
    wait_for(lambda: incident_epochs(pg_url, "red"), 10, "the leader's incident")

    # kill -9 the leader: the other takes over within the lease
    killed_at = time.monotonic()
    leader.kill(signal.SIGKILL)
    wait_for(lambda: other.health()["leader"], lease + 2, "the takeover")
    took = time.monotonic() - killed_at
    assert took < lease, took
    second_epoch = other.health()["epoch"]
    assert second_epoch > first_epoch

    # freeze the new leader; a fresh replica breaks its expired lease and leads
    third = ServerProcess(pg_url, tmp_path / "server2.log", "--lease", str(lease)).start()
    server_processes.append(third)
    other.kill(signal.SIGSTOP)
    wait_for(lambda: third.health()["leader"], 3 * lease + 5, "the lease to be broken")
    third_epoch = third.health()["epoch"]
    assert third_epoch > second_epoch
    assert post_report(third, token, report(job="during")) == 201
    wait_for(lambda: len(incident_epochs(pg_url, "red")) == 2, 10, "the new leader's incident")
    # the frozen one wakes: its late write (the lease renewal) is refused and it steps down
    other.kill(signal.SIGCONT)
    wait_for(lambda: metric(other, "denpex_server_fenced_writes_total") >= 1, 10, "the fence")
    assert not other.health()["leader"]
    assert third.health()["leader"]
    assert incident_epochs(pg_url, "red") == [first_epoch, third_epoch]
