"""Delivery status codes against a loopback OTLP receiver that answers each one: 408, 429
and 5xx are retried (after Retry-After), 413 halves the batch down to one record, a
redirect is never followed nor counted as a delivery, and 400/401/403/404/422 put the batch
in the dead-letter segment, which `denpex agent spool show --dead-letter` lists and
`denpex agent spool requeue` puts back."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from denpex.agent.dead_letter import dead_letter_dir, list_pending
from denpex.agent.otlp import OtlpHttpExporter
from denpex.agent.shipper import Shipper
from denpex.agent.spool import Spool
from denpex.core.events import Event, Evidence
from tests.agent.otlp_receiver import OtlpReceiver


def evidence(i: int) -> Evidence:
    return Evidence(f"id-{i}", Event(body=f"line {i}", host="h"), "sig", "cat", "error")


def wait_for(condition, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def receiver():
    r = OtlpReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def spools(tmp_path):
    spool = Spool(tmp_path / "spool")
    dead = Spool(dead_letter_dir(tmp_path / "spool"))
    yield spool, dead
    spool.close()
    dead.close()


def shipper_for(spools, url: str, **kw) -> Shipper:
    spool, dead = spools
    kw = {"batch_size": 16, "max_backoff_s": 0.1, "min_backoff_s": 0.01, "seed": 2, **kw}
    return Shipper(spool, OtlpHttpExporter(url, timeout_s=2), dead_letter=dead, **kw)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_transient_statuses_are_retried_and_nothing_is_lost(receiver, spools, status) -> None:
    receiver.script = [status, status, status]
    shipper = shipper_for(spools, receiver.url)
    shipper.submit_evidence([evidence(i) for i in range(40)])
    shipper.start()
    try:
        assert wait_for(lambda: len(receiver.ids()) == 40)
    finally:
        shipper.stop(timeout=2)
    stats = shipper.stats()
    assert stats["failed_by_status"] == {str(status): 3}
    assert stats["dead_lettered_total"] == 0 and stats["dropped_total"] == 0
    assert stats["backlog"] == 0


def test_retry_after_is_honoured(receiver, spools) -> None:
    receiver.script = [503]
    receiver.retry_after = "1"
    shipper = shipper_for(spools, receiver.url)
    shipper.submit_evidence([evidence(1)])
    started = time.monotonic()
    shipper.start()
    try:
        assert wait_for(lambda: receiver.ids() == {"id-1"})
    finally:
        shipper.stop(timeout=2)
    assert time.monotonic() - started >= 0.95  # the backoff alone is at most 0.1 s


def test_413_halves_the_batch_down_to_what_the_endpoint_takes(receiver, spools) -> None:
    receiver.max_records = 3
    shipper = shipper_for(spools, receiver.url)
    shipper.submit_evidence([evidence(i) for i in range(37)])
    shipper.start()
    try:
        assert wait_for(lambda: len(receiver.ids()) == 37)
    finally:
        shipper.stop(timeout=2)
    accepted = [count for status, count in receiver.answers if status == 200]
    assert max(accepted) <= 3 and sum(accepted) == 37
    assert shipper.stats()["split_batches_total"] >= 2
    assert shipper.stats()["dead_lettered_total"] == 0


def test_a_record_too_large_alone_goes_to_the_dead_letter_segment(receiver, spools) -> None:
    receiver.max_records = 0
    shipper = shipper_for(spools, receiver.url)
    shipper.submit_evidence([evidence(i) for i in range(4)])
    shipper.start()
    try:
        assert wait_for(lambda: shipper.stats()["dead_lettered_total"] == 4)
    finally:
        shipper.stop(timeout=2)
    assert shipper.stats()["dead_lettered_by_status"] == {"413": 4}
    assert not receiver.ids()


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirect_is_never_followed_and_never_counted_as_sent(receiver, spools, status) -> None:
    receiver.script = [status] * 4
    shipper = shipper_for(spools, receiver.url)
    shipper.submit_evidence([evidence(i) for i in range(10)])
    shipper.start()
    try:
        assert wait_for(lambda: shipper.stats()["failed_by_status"].get(str(status)) == 4)
        assert shipper.stats()["sent_total"] == 0 and receiver.gets == 0
        assert wait_for(lambda: len(receiver.ids()) == 10)  # the batch stayed
    finally:
        shipper.stop(timeout=2)
    assert receiver.gets == 0
    assert shipper.stats()["sent_total"] == 10


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_refused_for_good_goes_to_the_dead_letter_segment_and_can_be_requeued(
    receiver, tmp_path, status
) -> None:
    receiver.status = status
    spool_dir = tmp_path / "spool"
    spool, dead = Spool(spool_dir), Spool(dead_letter_dir(spool_dir))
    shipper = shipper_for((spool, dead), receiver.url)
    shipper.submit_evidence([evidence(i) for i in range(20)])
    shipper.start()
    try:
        assert wait_for(lambda: shipper.stats()["dead_lettered_total"] == 20)
        assert shipper.stats()["backlog"] == 0 and shipper.stats()["dropped_total"] == 0
        listing = list_pending(dead_letter_dir(spool_dir))
        assert listing.pending == 20
        assert {e["status"] for e in listing.records} == {status}
        assert {e["record"]["id"] for e in listing.records} == {f"id-{i}" for i in range(20)}
    finally:
        shipper.stop(timeout=2)
        spool.close()
        dead.close()

    shown = denpex("agent", "spool", "show", "--dead-letter", "--json", "--state-dir", tmp_path)
    assert shown.returncode == 0, shown.stderr
    data = json.loads(shown.stdout)
    assert data["pending"] == 20 and data["records"][0]["status"] == status
    text = denpex("agent", "spool", "show", "--dead-letter", "--state-dir", tmp_path)
    assert f"HTTP {status}" in text.stdout and "spool requeue" in text.stdout

    requeued = denpex("agent", "spool", "requeue", "--state-dir", tmp_path)
    assert requeued.returncode == 0 and "requeued 20 record(s)" in requeued.stdout
    assert list_pending(dead_letter_dir(spool_dir)).pending == 0
    receiver.status = 200  # the configuration was fixed
    spool, dead = Spool(spool_dir), Spool(dead_letter_dir(spool_dir))
    shipper = shipper_for((spool, dead), receiver.url)
    shipper.start()
    try:
        assert wait_for(lambda: len(receiver.ids()) == 20)
    finally:
        shipper.stop(timeout=2)
        spool.close()
        dead.close()


def denpex(*args) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "denpex", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
    )
