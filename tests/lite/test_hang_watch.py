"""The rank sampler: /proc parsers, real blocked processes (a FIFO open, a futex wait), and
naming the straggler only after a collective timed out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.lite.hang_watch import Block, HangWatch, RankTrack, innermost_frame
from denpex.lite.job_processes import JobProcess
from denpex.lite.rank_state import (
    ThreadState,
    parse_state,
    parse_syscall,
    sample_thread,
    syscall_table,
)


def test_parsers():
    assert parse_syscall("running").running
    line = parse_syscall("257 0xffffff9c 0x7f80d1f24590 0x80000 0x0 0x0 0x0 0x7ffc 0x7f80")
    assert line is not None and (line.nr, line.args[1]) == (257, 0x7F80D1F24590)
    assert parse_syscall("-1 0x7ffc 0x7f80").nr == -1
    assert parse_syscall("garbage") is None
    assert parse_state("42 (a b) c) S 1 42") == "S"
    assert syscall_table("x86_64")[257] == ("openat", "path 1")
    assert syscall_table("aarch64")[56] == ("openat", "path 1")
    assert syscall_table("sparc") == {}


def _wait_for(pid: int, kind: str) -> ThreadState:
    table = syscall_table()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = sample_thread(Roots(), pid, table)
        if state is not None and state.kind == kind:
            return state
        time.sleep(0.05)
    pytest.fail(f"process {pid} never reached a {kind!r} state: {state}")


@pytest.mark.skipif(not syscall_table(), reason="no syscall table for this architecture")
def test_a_process_blocked_opening_a_fifo_is_seen_with_the_path(tmp_path):
    fifo = tmp_path / "shard_3.bin"
    os.mkfifo(fifo)
    child = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'rb')"])
    try:
        state = _wait_for(child.pid, "blocked")
        assert state.what == f"openat({str(fifo)!r})", state
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(not syscall_table(), reason="no syscall table for this architecture")
def test_a_thread_waiting_on_a_condition_is_communication_not_straggling():
    child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
    try:
        assert _wait_for(child.pid, "wait").what == "futex"
    finally:
        child.kill()
        child.wait()
    assert sample_thread(Roots(), child.pid, syscall_table()) is None  # gone: no guess


def _watch_with(blocks: dict[int, Block]) -> HangWatch:
    watch = HangWatch(Roots(), host="node1")
    for rank, block in blocks.items():
        watch.ranks[rank] = RankTrack(rank, 1000 + rank, current=block)
    return watch


def _timeout() -> Evidence:
    event = Event(body="Watchdog caught collective operation timeout", rank=0)
    return Evidence("e1", event, "nccl.timeout.watchdog", "nccl.timeout", "error")


def test_the_rank_blocked_outside_communication_at_the_first_failure_is_named():
    opened = ThreadState("blocked", "openat('/data/shard_3.bin')", "k1")
    waiting = ThreadState("wait", "futex", "k2")
    watch = _watch_with({0: Block(waiting, 100.0, 1, 119.0), 1: Block(opened, 100.0, 7_000, 125.0)})
    [found] = watch.findings([_timeout()], first_failure=119.0)
    assert (found.category, found.signature, found.event.rank) == (
        "train.hang",
        "train.hang.rank_blocked",
        1,
    )
    assert found.summary == "rank 1 blocked in openat('/data/shard_3.bin') for 19 s"
    assert found.event.ts_ns == 7_000 and found.event.attrs["blocked_s"] == 19.0
    assert watch.findings([], first_failure=119.0) == []  # no collective timed out
    assert watch.findings([_timeout()], first_failure=None) == []
    short = _watch_with({1: Block(opened, 118.0, 1, 119.0)})
    assert short.findings([_timeout()], first_failure=119.0) == []  # blocked only 1 s


def test_sampling_live_ranks_tracks_blocks_and_costs_little(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    child = subprocess.Popen([sys.executable, "-c", f"open({str(fifo)!r}, 'rb')"])
    try:
        _wait_for(child.pid, "blocked")
        watch = HangWatch(Roots())
        ranks = {1: JobProcess(child.pid, rank=1)}
        for _ in range(20):
            watch.sample(ranks)
        block = watch.ranks[1].current
        assert block is not None and block.state.kind == "blocked" and block.until > block.since
        assert any(str(fifo) in f for f in block.files) is False  # open() has not returned yet
        assert watch.samples == 20
        assert watch.sample_seconds / watch.samples < 0.01  # a few /proc reads per rank
    finally:
        child.kill()
        child.wait()


def test_innermost_frame_of_a_py_spy_dump():
    dump = (
        "Process 42: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 43 (idle): "pt_autograd_0"\n    run (threading.py:975)\n'
        'Thread 42 (idle): "MainThread"\n    main (gloo_job.py:58)\n    <module> (gloo_job.py:80)\n'
    )
    assert innermost_frame(dump) == "main (gloo_job.py:58)"
    assert innermost_frame("py-spy dump failed: Permission denied") is None
