"""Spool: model-based stateful test, torn tails and flipped bytes, bounds, the lock, and
kill -9 of a real shipping process, 20 times, with the endpoint down for a while."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from denpex.agent.spool import HEADER, Spool, SpoolLockedError, encode_record, scan_records
from denpex.core import jsonio
from tests.agent.otlp_receiver import OtlpReceiver

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).parent / "children" / "spool_driver.py"


def rec(i: int, pad: int = 0) -> dict:
    return {"id": f"r{i}", "body": "x" * pad}


def read_all(spool: Spool) -> list[dict]:
    return spool.read(10**9)[1]


# --- model-based -------------------------------------------------------------------------


class SpoolMachine(RuleBasedStateMachine):
    """The spool against a list of pending records; reopen = restart of the process."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="spool-model-")
        self.next_id = 0
        self.model: list[dict] = []
        self.last_read: tuple | None = None
        self.dropped_seen = 0

    @initialize(bounded=st.booleans(), segment=st.sampled_from([300, 1000, 1 << 20]))
    def open(self, bounded: bool, segment: int) -> None:
        self.max_bytes = 3000 if bounded else 1 << 30
        self.segment = segment
        self.spool = Spool(self.dir, max_bytes=self.max_bytes, segment_bytes=segment, fsync="never")

    @rule(n=st.integers(1, 12), pad=st.integers(0, 120))
    def append(self, n: int, pad: int) -> None:
        batch = [rec(self.next_id + i, pad) for i in range(n)]
        self.next_id += n
        self.spool.append(batch)
        self.model.extend(batch)
        self._sync_drops()

    @rule(k=st.integers(1, 20))
    def read(self, k: int) -> None:
        cursor, got = self.spool.read(k)
        assert got == self.model[: len(got)]
        assert len(got) == min(k, len(self.model))
        self.last_read = (cursor, len(got))

    @rule()
    def ack(self) -> None:
        if self.last_read is None:
            return
        cursor, n = self.last_read
        before = self.spool.stats()["acked_total"]
        self.spool.ack(cursor)
        assert self.spool.stats()["acked_total"] - before == n
        del self.model[:n]
        self.last_read = None

    @rule()
    def reopen(self) -> None:
        self.spool.close()
        self.spool = Spool(
            self.dir, max_bytes=self.max_bytes, segment_bytes=self.segment, fsync="never"
        )
        self.dropped_seen = 0
        # A cursor read before the restart still names the same bytes.

    def _sync_drops(self) -> None:
        """Under the size bound the spool keeps a suffix of the model; the rest is counted."""
        got = read_all(self.spool)
        assert got == self.model[len(self.model) - len(got) :]
        dropped = self.spool.stats()["dropped_total"]["size"]
        assert dropped - self.dropped_seen == len(self.model) - len(got)
        if len(got) < len(self.model):
            self.last_read = None  # what it acknowledged may be gone
        self.dropped_seen = dropped
        self.model = got
        if self.max_bytes > 1 << 29:
            assert dropped == 0

    @invariant()
    def bounded_and_counted(self) -> None:
        if not hasattr(self, "spool"):
            return
        stats = self.spool.stats()
        assert stats["bytes"] <= self.max_bytes
        assert stats["records_pending"] == len(self.model)
        assert stats["corrupt_total"] == 0

    def teardown(self) -> None:
        if hasattr(self, "spool"):
            self.spool.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestSpoolModel = SpoolMachine.TestCase
TestSpoolModel.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# --- corruption ----------------------------------------------------------------------------


def _filled(tmp_path: Path, n: int = 20) -> tuple[Path, list[dict]]:
    records = [rec(i, pad=i * 3) for i in range(n)]
    with Spool(tmp_path) as spool:
        spool.append(records)
    (segment,) = tmp_path.glob("*.seg")
    return segment, records


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.integers(0, 10**6))
def test_torn_tail_is_skipped_counted_and_writing_continues(tmp_path_factory, cut) -> None:
    directory = tmp_path_factory.mktemp("torn")
    segment, records = _filled(directory)
    data = segment.read_bytes()
    cut %= len(data)
    segment.write_bytes(data[:cut])
    whole = [r for r, (_s, end, _t) in zip(records, scan_records(data), strict=True) if end <= cut]
    with Spool(directory) as spool:
        assert read_all(spool) == whole
        torn = cut not in {0} | {end for _s, end, _t in scan_records(data)}
        assert spool.stats()["corrupt_total"] == int(torn)
        spool.append([rec(999)])
        assert read_all(spool) == [*whole, rec(999)]
    with Spool(directory) as spool:  # the torn segment stays torn; the new one is clean
        assert read_all(spool) == [*whole, rec(999)]


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(position=st.integers(0, 10**6), xor=st.integers(1, 255))
def test_flipped_byte_loses_one_record_only(tmp_path_factory, position, xor) -> None:
    directory = tmp_path_factory.mktemp("flip")
    segment, records = _filled(directory)
    data = bytearray(segment.read_bytes())
    position %= len(data)
    data[position] ^= xor
    segment.write_bytes(bytes(data))
    with Spool(directory) as spool:
        got = read_all(spool)
        assert len(got) == len(records) - 1
        assert all(r in records for r in got)
        assert spool.stats()["dropped_total"]["corrupt"] == 1


def test_garbage_between_records_and_unknown_files_are_survived(tmp_path: Path) -> None:
    blob = (
        encode_record(jsonio.dumps(rec(1)), time.time_ns())
        + os.urandom(777)
        + encode_record(jsonio.dumps(rec(2)), time.time_ns())
    )
    (tmp_path / "000000000001.seg").write_bytes(blob)
    (tmp_path / "notes.seg").write_bytes(b"ignore me")
    (tmp_path / "cursor.json").write_bytes(b"{not json")  # unreadable cursor: start over
    with Spool(tmp_path) as spool:
        assert read_all(spool) == [rec(1), rec(2)]
        assert spool.stats()["corrupt_total"] == 1


# --- bounds, cursor, lock ------------------------------------------------------------------


def test_age_bound_drops_and_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The old records are written two hours in the past rather than waited for: a bound
    # of milliseconds also expired the new record whenever a loaded machine paused the test.
    real_time_ns = time.time_ns
    with Spool(tmp_path, max_age_s=3600, segment_bytes=200) as spool:
        with monkeypatch.context() as past:
            past.setattr(time, "time_ns", lambda: real_time_ns() - 7200 * 10**9)
            spool.append([rec(i, 50) for i in range(10)])
        spool.append([rec(100)])
        assert read_all(spool) == [rec(100)]
        assert spool.stats()["dropped_total"]["age"] == 10


def test_size_bound_keeps_newest_and_counts_oversized(tmp_path: Path) -> None:
    with Spool(tmp_path, max_bytes=4096, segment_bytes=1024) as spool:
        spool.append([rec(i, 100) for i in range(200)])
        got = read_all(spool)
        assert got[-1] == rec(199, 100) and len(got) < 200
        stats = spool.stats()
        assert stats["bytes"] <= 4096
        assert stats["dropped_total"]["size"] == 200 - len(got)
        spool.append([rec(1000, 10_000)])  # larger than the whole spool
        assert spool.stats()["dropped_total"]["size"] == 201 - len(got)


def test_acked_records_are_not_resent_after_restart(tmp_path: Path) -> None:
    with Spool(tmp_path, segment_bytes=512, fsync="always") as spool:
        spool.append([rec(i, 40) for i in range(30)])
        cursor, _ = spool.read(12)
        spool.ack(cursor)
        spool.ack((0, 0))  # an older cursor changes nothing
        segments = spool.stats()["segments"]
    with Spool(tmp_path) as spool:
        assert read_all(spool) == [rec(i, 40) for i in range(12, 30)]
        cursor, _ = spool.read(100)
        spool.ack(cursor)
        assert spool.stats()["records_pending"] == 0
        assert spool.stats()["segments"] < segments  # delivered segments are deleted


def test_second_opener_gets_a_clear_error(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    with pytest.raises(SpoolLockedError, match=str(tmp_path)):
        Spool(tmp_path)
    code = f"from denpex.agent.spool import Spool; Spool({str(tmp_path)!r})"
    child = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30
    )
    assert child.returncode != 0 and "is in use by process" in child.stderr
    spool.close()
    Spool(tmp_path).close()


def test_header_layout_is_stable() -> None:
    assert HEADER.size == 20
    blob = encode_record(b'{"a":1}', 7)
    assert blob[:4] == b"DX\x01\x00" and len(blob) == 27


# --- kill -9 -------------------------------------------------------------------------------


def _start_driver(spool_dir: Path, endpoint: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(DRIVER), "--spool", str(spool_dir), "--endpoint", endpoint, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def _collect(proc: subprocess.Popen[str], lines: list[str]) -> threading.Thread:
    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.endswith("\n"):  # a torn last line was never fully printed
                lines.append(line[:-1])

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return thread


def test_kill_9_twenty_times_with_endpoint_down_loses_nothing_acknowledged(tmp_path) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rng = random.Random(seed)
    receiver = OtlpReceiver().start()
    spool_dir = tmp_path / "spool"
    acknowledged: set[str] = set()
    try:
        for run in range(20):
            if run == 6:
                receiver.status = 503  # down, still listening
                receiver.retry_after = "0"
            if run == 10:
                receiver.stop()  # down, connection refused
            if run == 13:
                receiver.status = 200
                receiver.start()  # same port
            proc = _start_driver(spool_dir, receiver.url)
            lines: list[str] = []
            pump = _collect(proc, lines)
            # kill at a random moment after the driver is appending (its start-up time
            # depends on the host's load, not on the spool)
            deadline = time.monotonic() + 30
            while not lines and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.05, 0.5))
            proc.kill()
            proc.wait(10)
            pump.join(10)
            assert proc.returncode == -9, proc.stderr.read() if proc.stderr else ""
            acknowledged.update(lines)
        proc = _start_driver(spool_dir, receiver.url, "--drain")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and "DRAINED" in out, err
        received = receiver.ids()
        lost = acknowledged - received
        print(
            f"acknowledged={len(acknowledged)} received={len(received)} "
            f"duplicates={receiver.duplicates} lost={len(lost)}"
        )
        assert len(acknowledged) >= 20  # every run was killed mid-stream, after appending
        assert not lost, sorted(lost)[:10]
    finally:
        receiver.stop()
