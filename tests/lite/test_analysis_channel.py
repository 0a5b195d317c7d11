"""The analysis ring and the analyzer process: a model-checked ring, real fork, real pipes.

The producer side must never block; the consumer must see records exactly as pushed (or a gap).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections import deque
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from denpex.lite import analysis_ring
from denpex.lite.analysis_channel import ANALYSIS_FAILED, Analyzer
from denpex.lite.analysis_ring import AnalysisRing

HDR = 16  # length, stream, flags, padding, arrival time


def pop3(ring: AnalysisRing):
    """(stream, payload, gap) of the next record, its arrival time checked to be a time."""
    record = ring.pop()
    if record is None:
        return None
    assert record[3] > 1_700_000_000 * 10**9  # ns since the epoch, stamped by the producer
    return record[:3]


def record_size(n: int) -> int:
    return HDR + ((n + 15) & ~15)


@settings(max_examples=300, deadline=None)
@given(
    capacity=st.sampled_from([4096, 4104, 5000, 8192]),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("push"), st.integers(0, 2048), st.sampled_from([1, 2])),
            st.tuples(st.just("pop"), st.integers(1, 5), st.just(0)),
        ),
        max_size=120,
    ),
)
def test_ring_matches_a_queue_model(capacity: int, ops: list[tuple[str, int, int]]) -> None:
    ring = AnalysisRing(capacity)
    cap = ring.capacity
    model: deque[tuple[int, bytes, bool]] = deque()
    used, gap, counter = 0, False, 0
    dropped_bytes = dropped_chunks = 0
    try:
        for op, arg, stream in ops:
            if op == "push":
                if arg == 0:
                    continue  # nothing to send
                data = bytes((counter + i) % 251 for i in range(arg))
                counter += 1
                fits = used + record_size(arg) <= cap
                assert ring.push(stream, data) is fits
                if fits:
                    model.append((stream, data, gap))
                    used += record_size(arg)
                    gap = False
                else:
                    gap = True
                    dropped_bytes += arg
                    dropped_chunks += 1
            else:
                for _ in range(arg):
                    got = pop3(ring)
                    if not model:
                        assert got is None
                        break
                    want = model.popleft()
                    assert got == want
                    used -= record_size(len(want[1]))
        assert ring.dropped_bytes == dropped_bytes and ring.dropped_chunks == dropped_chunks
        assert ring.stats()[1:] == (dropped_bytes, dropped_chunks)
        while model:
            assert pop3(ring) == model.popleft()
        assert ring.pop() is None
    finally:
        ring.close()


def test_zero_copy_reserve_wraps_into_two_views() -> None:
    ring = AnalysisRing(4096)
    try:
        for size in (2032, 1008):  # two records: 2048 + 1024 bytes of the 4096
            assert ring.push(1, b"a" * size)
            assert pop3(ring) == (1, b"a" * size, False)
        views = ring.reserve(2000, 1)
        assert views is not None and len(views) == 2  # payload starts at 3088, wraps at 4096
        assert len(views[0]) == 4096 - 3088
        data = bytes(range(256)) * 8
        first = len(views[0])
        views[0][:] = data[:first]
        views[1][: 2000 - first] = data[first:2000]
        ring.commit(2, 2000)
        assert pop3(ring) == (2, data[:2000], False)
    finally:
        ring.close()


def test_a_record_carries_the_time_its_chunk_was_read() -> None:
    """A lagging analyzer times lines by when the relay read them, not when it pops them."""
    ring = AnalysisRing(4096)
    try:
        before = time.time_ns()
        assert ring.push(1, b"early\n")
        after = time.time_ns()
        assert ring.push(1, b"given\n", arrival_ns=42)
        time.sleep(0.05)
        first, second = ring.pop(), ring.pop()
        assert first is not None and before <= first[3] <= after
        assert second is not None and second[3] == 42
    finally:
        ring.close()


def test_large_push_is_split_into_records() -> None:
    ring = AnalysisRing(4096)
    try:
        data = os.urandom(3000)
        assert ring.push(1, data)
        first, second = ring.pop(), ring.pop()
        assert first is not None and second is not None
        assert first[1] + second[1] == data and len(first[1]) == 2048
    finally:
        ring.close()


def test_gap_flag_marks_the_record_after_a_drop() -> None:
    ring = AnalysisRing(4096)
    try:
        assert ring.push(1, b"x" * 2048)
        assert not ring.push(1, b"y" * 2048)  # no room: dropped
        assert pop3(ring) == (1, b"x" * 2048, False)
        assert ring.push(2, b"z")
        assert pop3(ring) == (2, b"z", True)
        assert ring.stats() == (2048 * 2 + 1, 2048, 1)
    finally:
        ring.close()


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40000), min_size=1, max_size=12),
    committed_after=st.integers(0, 12),
)
def test_tail_of_dropped_bytes_reaches_analysis(sizes: list[int], committed_after: int) -> None:
    ring = AnalysisRing(1 << 20)
    try:
        dropped = b""
        for i, n in enumerate(sizes):
            data = bytes((i * 7 + j) % 256 for j in range(n))
            if i == committed_after:  # a record after drops: what came before is never resent
                assert ring.push(1, b"kept")
                dropped = b""
            ring.drop(n, 1, memoryview(data))
            dropped += data
        total_dropped = ring.dropped_bytes
        records = []
        ring.push_tails(lambda n: True)
        while (rec := pop3(ring)) is not None:
            records.append(rec)
        tail = dropped[-(64 << 10) :]
        assert records[-1] == (1, tail, True)
        assert ring.dropped_bytes == total_dropped - len(tail)
    finally:
        ring.close()


def test_producer_never_blocks_without_a_consumer() -> None:
    ring = AnalysisRing(64 << 10)
    try:
        chunk = b"q" * 1024
        start = time.monotonic()
        results = [ring.push(1, chunk) for _ in range(20000)]
        assert time.monotonic() - start < 2.0
        assert results.count(True) == (64 << 10) // (1024 + HDR)
        assert ring.dropped_chunks == results.count(False)
    finally:
        ring.close()


def fork_checking_consumer(ring: AnalysisRing, verdict: Path) -> int:
    """Fork a consumer that checks every record until the producer is done, then writes
    `ok N` (or what was wrong) to `verdict`; its pid. Records carry their sequence number
    (8 bytes, repeated) on stream 1 + seq % 2; a skipped one must be marked by a gap."""
    pid = os.fork()
    if pid:
        return pid
    text, expect, seen = "ok", 0, 0
    try:
        while True:
            rec = ring.pop()
            if rec is None:
                if ring.producer_done and ring.pop() is None:
                    break
                ring.wait(0.05)
                continue
            stream, data, gap, _ = rec
            seq = int.from_bytes(data[:8], "little")
            if data != data[:8] * (len(data) // 8) or stream != 1 + seq % 2:
                text = f"bad payload in record {seq}"
                break
            if (seq != expect and not gap) or seq < expect:
                text = f"record {seq} after {expect - 1} without a gap"
                break
            expect, seen = seq + 1, seen + 1
        verdict.write_text(f"{text} {seen}")
    finally:
        os._exit(0)


def test_concurrent_producer_and_consumer_agree(tmp_path: Path) -> None:
    """A forked consumer checks every record while the producer pushes flat out (1 s)."""
    seed = 424242
    print("seed", seed)
    ring = AnalysisRing(1 << 20)
    verdict = tmp_path / "verdict"
    pid = fork_checking_consumer(ring, verdict)
    rnd = random.Random(seed)
    seq = pushed = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        size = 8 * rnd.choice([1, 16, 512, 8192, rnd.randrange(1, 60000)])
        pushed += ring.push(1 + seq % 2, seq.to_bytes(8, "little") * (size // 8))
        seq += 1
    ring.finish_producer()
    os.waitpid(pid, 0)
    text, seen = verdict.read_text().rsplit(" ", 1)
    ring.close()
    assert text == "ok" and int(seen) == pushed > 1000


def test_a_run_that_lags_again_and_again_never_uses_the_spill_up() -> None:
    """The spill's budget bounds what waits on disk at once, not a whole run: once the analyzer
    has read the file, the next spill starts it again from its beginning (a new epoch) and
    gives its blocks back."""
    budget = 4 * (HDR + 1000)
    ring = AnalysisRing(4096, spill_bytes=budget)
    try:
        for round_ in range(20):  # 20 times 4 chunks in the ring and 3 behind it, on disk
            sent = []
            for k in range(7):
                data = (round_ * 10 + k).to_bytes(2, "little") * 500
                if not ring.spilling and ring.reserve(len(data), len(data)) is not None:
                    assert ring.push(1, data)
                else:
                    assert ring.spill(1, memoryview(data)), f"round {round_}: spill refused"
                sent.append(data)
            assert ring.spilling
            assert ring.backlog_bytes == 4 * record_size(1000) + 3 * (HDR + 1000)
            got = []
            while (record := pop3(ring)) is not None:
                got.append(record[1])
            assert got == sent and not ring.spilling and ring.backlog_bytes == 0
            assert os.fstat(ring._spill_fd).st_size <= budget
        assert ring.dropped_bytes == 0 and ring.spilled_bytes == 20 * 3 * 1000
    finally:
        ring.close()


def test_a_consumer_follows_the_spill_as_it_starts_again(tmp_path: Path) -> None:
    """The relay's way (the ring, else the spill, else a gap) flat out for 1 s beside a forked
    consumer, with a spill so small that it starts again many times: every record arrives in
    order, each one skipped is marked by a gap."""
    ring = AnalysisRing(64 << 10, spill_bytes=256 << 10)
    verdict = tmp_path / "verdict"
    pid = fork_checking_consumer(ring, verdict)
    rnd = random.Random(77)
    seq = delivered = 0
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        data = seq.to_bytes(8, "little") * rnd.choice([1, 64, 1024, 4096])
        stream = 1 + seq % 2
        if not ring.spilling and ring.reserve(len(data), len(data)) is not None:
            delivered += ring.push(stream, data)
        elif ring.spill(stream, memoryview(data)):
            delivered += 1
        else:
            ring.drop(len(data), stream)
        seq += 1
    ring.finish_producer()
    os.waitpid(pid, 0)
    text, seen = verdict.read_text().rsplit(" ", 1)
    restarts = ring._spill_w >> 40
    ring.close()
    assert text == "ok" and int(seen) == delivered > 1000
    assert restarts > 0, "the spill never started again: the test did not test it"


class _PausingWords:
    """The ring's header words, running `between` once, right after the consumer reads one
    word: the producer acting between two loads of the consumer's pop()."""

    def __init__(self, words, after_index: int, between) -> None:
        self.words, self.after_index, self.between = words, after_index, between

    def __getitem__(self, index: int) -> int:
        value = self.words[index]
        if index == self.after_index and self.between is not None:
            between, self.between = self.between, None
            between()
        return value

    def __setitem__(self, index: int, value: int) -> None:
        self.words[index] = value


@pytest.mark.parametrize("paused_after", ["write_pos", "spill_w"])
def test_a_spill_never_overtakes_the_ring_refilled_under_the_consumer(paused_after: str) -> None:
    """The consumer finds the ring empty; before it looks at the spill the relay fills the ring
    and spills the next chunk behind it. The spilled chunk must still come after the ring's."""
    ring = AnalysisRing(4096, spill_bytes=1 << 20)
    chunks = [bytes([k]) * 1000 for k in range(5)]  # 4 fill the ring, the 5th is spilled

    def relay() -> None:
        for data in chunks:
            if not ring.spilling and ring.reserve(len(data), len(data)) is not None:
                assert ring.push(1, data)
            else:
                assert ring.spill(1, memoryview(data))

    index = {"write_pos": analysis_ring._W, "spill_w": analysis_ring._SPILL_W}[paused_after]
    words = ring._words
    ring._words = _PausingWords(words, index, relay)
    try:
        got = []
        for _ in range(8):
            record = ring.pop()
            if record is not None:
                got.append(record[1])
        assert got == chunks and ring.spilled_bytes == 1000
    finally:
        ring._words = words
        ring.close()


class HashSession:
    """Hashes what it is fed; finish() writes the digest, counts and the result to a file."""

    def __init__(self, child_pid: int | None, out: Path, finish_delay: float = 0.0) -> None:
        self.out, self.finish_delay = out, finish_delay
        self.child_pid = child_pid
        self.sha = hashlib.sha256()
        self.n = self.gaps = self.ticks = 0

    def feed(self, stream: int, data: bytes, gap: bool, arrival_ns: int | None = None) -> None:
        self.sha.update(data)
        self.n += len(data)
        self.gaps += gap

    def tick(self) -> None:
        self.ticks += 1

    def finish(self, result: object) -> int:
        time.sleep(self.finish_delay)
        doc = {"sha": self.sha.hexdigest(), "n": self.n, "gaps": self.gaps, "ticks": self.ticks,
               "pid": self.child_pid, "result": result}  # fmt: skip
        self.out.write_text(json.dumps(doc))
        return 5


def test_analyzer_receives_every_byte_across_fork(tmp_path: Path) -> None:
    seed = 20261130
    print("seed", seed)
    rnd = random.Random(seed)
    out = tmp_path / "a.json"
    analyzer = Analyzer.start(lambda pid: HashSession(pid, out), 64 << 10)
    want = hashlib.sha256()
    try:
        analyzer.begin(4242)
        ring, total = analyzer.ring, 0
        for _ in range(400):
            data = rnd.randbytes(rnd.randrange(1, 30000))
            while not ring.wait_for_space(len(data), 1.0):
                pass
            assert ring.push(1, data)
            want.update(data)
            total += len(data)
        assert analyzer.finish({"total": total}, timeout=30) == 5
    finally:
        analyzer.ring.close()
    doc = json.loads(out.read_text())
    assert doc == {"sha": want.hexdigest(), "n": total, "gaps": 0, "ticks": doc["ticks"],
                   "pid": 4242, "result": {"total": total}}  # fmt: skip


def test_analyzer_ticks_while_idle(tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    analyzer = Analyzer.start(lambda pid: HashSession(pid, out), 1 << 16)
    try:
        analyzer.begin(None)
        time.sleep(0.7)
        assert analyzer.finish(None) == 5
    finally:
        analyzer.ring.close()
    assert json.loads(out.read_text())["ticks"] >= 2


def test_analyzer_that_does_not_finish_is_killed(tmp_path: Path, capfd) -> None:
    out = tmp_path / "a.json"
    analyzer = Analyzer.start(lambda pid: HashSession(pid, out, finish_delay=30), 1 << 16)
    try:
        analyzer.begin(None)
        start = time.monotonic()
        assert analyzer.finish(None, timeout=0.5) is None
        assert time.monotonic() - start < 5
    finally:
        analyzer.ring.close()
    assert "analysis did not finish within" in capfd.readouterr().err
    with pytest.raises(ChildProcessError):
        os.waitpid(analyzer.pid, os.WNOHANG)  # killed and reaped


def test_failing_session_factory_is_one_line_and_status_70(capfd) -> None:
    def factory(pid: int | None) -> HashSession:
        raise ValueError("no catalog\nsecond line")

    analyzer = Analyzer.start(factory, 1 << 16)
    try:
        analyzer.begin(None)
        assert analyzer.ring.push(1, b"data")
        assert analyzer.finish(None) == ANALYSIS_FAILED
    finally:
        analyzer.ring.close()
    err = capfd.readouterr().err
    assert err == "denpex: analysis failed: ValueError: no catalog second line\n"


def test_abort_never_builds_a_session(tmp_path: Path) -> None:
    marker = tmp_path / "built"

    def factory(pid: int | None) -> HashSession:
        marker.write_text("built")
        return HashSession(pid, tmp_path / "a.json")

    analyzer = Analyzer.start(factory, 1 << 16)
    try:
        analyzer.abort()
    finally:
        analyzer.ring.close()
    assert not marker.exists()
    with pytest.raises(ChildProcessError):
        os.waitpid(analyzer.pid, os.WNOHANG)


def test_the_session_times_an_untimed_line_by_the_relay_stamp() -> None:
    from denpex.catalog import load_catalog
    from denpex.lite.session import LiteSession, ReportOptions

    session = LiteSession(load_catalog(), ReportOptions(text=False))
    oom = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0\n"
    session.feed(1, b"[rank0]:" + oom, False, 1_700_000_000_123_000_000)
    (evidence,) = session.scanner.evidence
    assert evidence.event.ts_ns == 1_700_000_000_123_000_000
    assert evidence.event.attrs["ts_arrival"] is True
