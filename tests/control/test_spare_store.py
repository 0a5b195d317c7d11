"""The warm-spare pool in the store, both engines: a human's requests (add, remove, the refusals
a person sees), the leader's pass over them with a recording backend (hold out, preflight,
release), its writes behind the epoch fence, a removal that races the hold, and one tenant's
pool invisible to another; every act in an intact audit chain."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from denpex.control import audit_log
from denpex.control.db import Database
from denpex.control.leader import Leadership
from denpex.control.remediation_loop import RemediationPass
from denpex.control.spare_store import SpareStore
from denpex.control.store import Conflict, NotFound, Store
from denpex.core import audit
from denpex.remediation.spares import Check
from tests.remediation.test_backend import Recording

NOW = 1_800_000_000 * 10**9
CHECKS = [Check("ib_ports", ("sh", "-c", "echo {host}: Active; test {host} != bad-1"))]


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    database.migrate()
    yield database
    database.dispose()


def leader(db: Database) -> tuple[RemediationPass, Recording, SpareStore]:
    lead = Leadership(db, lease_s=60)
    assert lead.try_acquire(time.time_ns())
    backend = Recording()
    return (
        RemediationPass(db, Store(db), backend, spare_checks=CHECKS),
        backend,
        SpareStore(db, "acme", lead.fence),
    )


def test_requests_are_recorded_and_refused_as_a_person_reads_them(db: Database) -> None:
    human = SpareStore(db, "acme", None)
    made = human.add("gpu-7", "gpu", "alice via token:t1", NOW)
    assert (made["status"], made["pool"], made["preflight"]["passed"]) == ("requested", "gpu", None)
    with pytest.raises(Conflict, match="already a warm spare"):
        human.add("gpu-7", None, "bob", NOW)
    with pytest.raises(ValueError, match="not a node name"):
        human.add("gpu 7; rm -rf /", None, "bob", NOW)
    with pytest.raises(NotFound):
        human.remove("gpu-8", "bob", NOW)
    other = SpareStore(db, "globex", None)
    assert other.spares() == []
    with pytest.raises(NotFound):
        other.spare("gpu-7")
    with pytest.raises(NotFound):
        other.remove("gpu-7", "mallory", NOW)
    other.add("gpu-7", None, "carol", NOW)  # the same node name in another tenant: its own
    assert human.remove("gpu-7", "alice", NOW)["status"] == "removed"  # never held: gone now
    assert [s["host"] for s in other.spares()] == ["gpu-7"]
    with pytest.raises(PermissionError, match="fence"):
        human.drop("gpu-7", NOW)  # only the leader writes what the backend did


def test_the_leader_holds_checks_and_releases_spares(db: Database) -> None:
    remediation, backend, book = leader(db)
    human = SpareStore(db, "acme", None)
    human.add("good-1", "gpu", "alice", NOW)
    human.add("bad-1", None, "alice", NOW)
    pool = remediation.tend_spares(book, time.time_ns())
    calls = [(op, p.get("reason")) for op, p in backend.calls]
    assert calls.count(("cordon", "denpex: warm spare")) == 2
    assert ("cordon", "denpex: spare failed preflight") in calls
    assert ("diagnostics", None) in calls  # the failed one goes to diagnostics
    shown = {s["host"]: s for s in human.spares()}
    assert shown["good-1"]["status"] == "validated" and shown["good-1"]["preflight"]["passed"]
    assert shown["bad-1"]["status"] == "failed" and not shown["bad-1"]["preflight"]["passed"]
    assert pool.take("gpu", exclude=["n1"], reason="denpex: reroute").host == "good-1"

    backend.calls.clear()
    remediation.tend_spares(book, time.time_ns())  # nothing due: no check runs again
    assert backend.calls == []

    assert human.remove("bad-1", "alice", NOW)["status"] == "removing"
    remediation.tend_spares(book, time.time_ns())
    assert [op for op, _ in backend.calls] == ["resume"]
    assert "bad-1" not in {s["host"] for s in human.spares()}
    kinds = [audit.loads_record(line)["kind"] for line in audit_log.export_lines(db)]
    assert {"spare.added", "spare.enrolled", "spare.checked", "spare.removed"} <= set(kinds)
    assert kinds[-1] == "spare.released"
    lines = list(audit_log.export_lines(db))
    head = audit.head_of(audit.loads_record(lines[-1]))
    assert audit.verify_lines([*lines, audit.anchor_line(head, None)]).ok


def test_a_spare_removed_while_the_leader_holds_it_out_is_given_back(db: Database) -> None:
    remediation, backend, book = leader(db)
    human = SpareStore(db, "acme", None)
    human.add("gpu-3", None, "alice", NOW)
    cordon = backend.cordon

    def cordon_then_removed(target, *, reason, timeout_s):  # the human removes it meanwhile
        done = cordon(target, reason=reason, timeout_s=timeout_s)
        human.remove("gpu-3", "alice", NOW)
        return done

    backend.cordon = cordon_then_removed  # type: ignore[method-assign]
    pool = remediation.tend_spares(book, time.time_ns())
    assert [op for op, _ in backend.calls] == ["cordon", "resume"]  # not left drained
    assert pool.spares == {} and human.spares() == []
