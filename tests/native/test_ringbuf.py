"""The ring buffer: native and reference agree on every operation sequence (hypothesis).

The state machine drives both through random write and read sizes, wrap-arounds, overflows and
long lines; the reference alone is checked against a plain model of its documented policy.
"""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from denpex._native import ringbuf_ref
from tests.native.native_support import native_module

CHUNKS = st.lists(
    st.sampled_from([b"a", b"bc", b"\n", b"\r", b"\r\n", b"line\n", b"\x00", b"\xff", b"x" * 40]),
    max_size=12,
).map(b"".join)


class RingAgreement(RuleBasedStateMachine):
    @initialize(capacity=st.integers(1, 64), line_cap=st.integers(1, 20))
    def build(self, capacity, line_cap):
        self.native = native_module("ringbuf").RingBuffer(capacity, line_cap)
        self.reference = ringbuf_ref.RingBuffer(capacity, line_cap)

    @rule(data=CHUNKS)
    def write(self, data):
        assert self.native.write(data) == self.reference.write(data) == len(data)

    @rule(max_bytes=st.integers(-1, 70))
    def read(self, max_bytes):
        assert self.native.read(max_bytes) == self.reference.read(max_bytes)

    @rule()
    def read_lines(self):
        assert self.native.read_lines() == self.reference.read_lines()

    @rule()
    def flush(self):
        assert self.native.flush() == self.reference.flush()

    @invariant()
    def counters_agree(self):
        for name in ("used", "dropped_bytes", "overflows", "truncated_bytes"):
            assert getattr(self.native, name) == getattr(self.reference, name), name
        assert self.native.used <= self.native.capacity


RingAgreement.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRingAgreement = RingAgreement.TestCase


def implementations():
    yield ringbuf_ref
    try:
        yield native_module("ringbuf")
    except pytest.skip.Exception:
        return


def test_lines_across_wrap_around():
    for module in implementations():
        ring = module.RingBuffer(10)
        ring.write(b"abcdefg")
        assert ring.read(5) == b"abcde"
        ring.write(b"h\nijk\n")  # wraps
        assert ring.read_lines() == [b"fgh", b"ijk"]


def test_overflow_drops_the_oldest_and_resynchronises():
    for module in implementations():
        ring = module.RingBuffer(16)
        ring.write(b"old line\npartial")
        ring.write(b" rest\nnew line\n")  # 31 bytes into 16: the oldest 15 go
        assert ring.read_lines() == [b"new line"]
        assert ring.overflows == 1
        assert ring.dropped_bytes == 15 + len(b"l rest\n")  # overflow + the rest of the cut line
        assert ring.read_lines() == []


def test_write_larger_than_the_ring_keeps_its_end():
    for module in implementations():
        ring = module.RingBuffer(8)
        ring.write(b"0123456789\nab\ncd")
        assert ring.used == 8
        assert ring.flush() == [b"ab", b"cd"]


def test_random_sequences_match_the_reference():
    seed = 20261130
    print("seed", seed)
    native = native_module("ringbuf").RingBuffer(4096, 256)
    reference = ringbuf_ref.RingBuffer(4096, 256)
    rng = random.Random(seed)
    for _ in range(2000):
        data = rng.randbytes(rng.randrange(0, 3000)).replace(b"\x0b", b"\n")
        native.write(data)
        reference.write(data)
        if rng.random() < 0.3:
            assert native.read_lines() == reference.read_lines()
    assert native.flush() == reference.flush()
    assert native.dropped_bytes == reference.dropped_bytes


def test_threads_producer_and_consumer_lose_nothing_without_overflow():
    ring = native_module("ringbuf").RingBuffer(1 << 24)
    lines = [f"line {k}".encode() for k in range(50_000)]
    received: list[bytes] = []
    done = threading.Event()

    def consume():
        while not done.is_set():
            received.extend(ring.read_lines())
        received.extend(ring.flush())

    consumer = threading.Thread(target=consume)
    consumer.start()
    for k in range(0, len(lines), 100):
        ring.write(b"\n".join(lines[k : k + 100]) + b"\n")
    done.set()
    consumer.join()
    assert received == lines
    assert ring.dropped_bytes == 0
