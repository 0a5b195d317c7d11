"""Shipper: spool → real OTLP receiver; outage and recovery, permanent refusal, best-effort
metrics, and a stop() that returns on time with the endpoint down."""

from __future__ import annotations

import random
import time

import pytest

from denpex.agent.otlp import OtlpHttpExporter
from denpex.agent.shipper import Shipper, backoff_delay
from denpex.agent.spool import Spool
from denpex.core.events import Event, Evidence, metric
from denpex.core.wire import evidence_to_dict
from tests.agent.otlp_receiver import OtlpReceiver


def evidence(i: int) -> Evidence:
    return Evidence(f"id-{i}", Event(body=f"b{i}", host="h"), "sig", "cat", "warning")


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def receiver():
    r = OtlpReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def spool(tmp_path):
    s = Spool(tmp_path / "spool")
    yield s
    s.close()


def make_shipper(spool, url: str, **kw) -> Shipper:
    exporter = OtlpHttpExporter(url, timeout_s=2)
    kw = {"batch_size": 50, "max_backoff_s": 0.2, "min_backoff_s": 0.02, "seed": 1, **kw}
    return Shipper(spool, exporter, **kw)


def test_delivers_everything_and_acks(receiver, spool) -> None:
    shipper = make_shipper(spool, receiver.url)
    shipper.start()
    shipper.submit_evidence([evidence(i) for i in range(333)])
    wait_for(lambda: len(receiver.ids()) == 333)
    assert shipper.stop(timeout=2)
    stats = shipper.stats()
    assert stats["sent_total"] == 333 and stats["backlog"] == 0 and stats["dropped_total"] == 0
    assert stats["last_success_ns"] is not None
    assert receiver.duplicates == 0
    assert spool.stats()["acked_total"] == 333


def test_outage_then_recovery_delivers_the_backlog(receiver, spool) -> None:
    receiver.status = 503
    shipper = make_shipper(spool, receiver.url)
    shipper.start()
    shipper.submit_evidence([evidence(i) for i in range(120)])
    wait_for(lambda: shipper.stats()["failed_total"] >= 3)
    assert shipper.stats()["backlog"] == 120 and not receiver.ids()
    receiver.status = 200
    wait_for(lambda: len(receiver.ids()) == 120)
    assert shipper.stop(timeout=2)


def test_permanent_refusal_is_dropped_counted_and_not_retried(receiver, spool) -> None:
    receiver.status = 400
    shipper = make_shipper(spool, receiver.url)
    shipper.start()
    shipper.submit_evidence([evidence(i) for i in range(10)])
    wait_for(lambda: shipper.stats()["backlog"] == 0)
    stats = shipper.stats()
    assert stats["dropped_by_reason"]["refused"] == 10 and stats["failed_total"] == 1
    shipper.stop(timeout=1)


def test_invalid_spooled_records_are_dropped_not_retried(receiver, spool) -> None:
    spool.append([{"not": "evidence"}, evidence_to_dict(evidence(1))])
    shipper = make_shipper(spool, receiver.url)
    shipper.start()
    wait_for(lambda: receiver.ids() == {"id-1"})
    assert shipper.stop(timeout=1)
    assert shipper.stats()["dropped_by_reason"]["invalid"] == 1


def test_metrics_are_best_effort(receiver, spool) -> None:
    shipper = make_shipper(spool, receiver.url)
    shipper.start()
    shipper.submit_metrics([metric("up", 1, source="agent")])
    wait_for(lambda: len(receiver.metric_requests) == 1)
    receiver.status = 503
    shipper.submit_metrics([metric("up", 1, source="agent"), metric("x", 2, source="agent")])
    wait_for(lambda: shipper.stats()["dropped_by_reason"]["metrics_unsent"] == 2)
    assert len(receiver.metric_requests) == 1  # never retried
    shipper.stop(timeout=1)


def test_stop_returns_on_time_with_the_endpoint_down(tmp_path) -> None:
    receiver = OtlpReceiver().start()
    url = receiver.url
    receiver.stop()
    spool = Spool(tmp_path)
    shipper = make_shipper(spool, url, max_backoff_s=5.0, min_backoff_s=2.0)
    shipper.start()
    shipper.submit_evidence([evidence(i) for i in range(5)])
    time.sleep(0.2)
    started = time.monotonic()
    assert shipper.stop(timeout=0.5) is False
    assert time.monotonic() - started < 1.5
    assert spool.stats()["records_pending"] == 5  # kept for the next start
    spool.close()


def test_backoff_grows_with_jitter_and_stays_bounded() -> None:
    rng = random.Random(3)
    delays = [backoff_delay(n, base_s=0.1, max_s=5.0, rng=rng) for n in range(12)]
    assert all(0.05 <= d <= 5.0 for d in delays)
    assert max(delays[-4:]) > 1.0 and delays[0] <= 0.1
