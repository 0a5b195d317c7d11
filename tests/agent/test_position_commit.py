"""Positions are committed after the data is safe: the real agent killed (SIGKILL) between a
kmsg poll and the spool append of its evidence loses no record across the restart; the
journal cursor and the kmsg sequence number stay put until the agent commits them; the
handoff releases acknowledgements in poll order, holds evidence while the spool refuses it,
and counts what its bound drops."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from denpex.agent.handoff import Handoff
from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.kmsg import KmsgRecord, format_record
from denpex.core.roots import Roots
from denpex.host.kmsg import KmsgCollector
from tests.agent.otlp_receiver import OtlpReceiver

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).parent / "children" / "kmsg_crash_agent.py"
BOOT = "boot-commit-test"


def xid(seq: int) -> bytes:
    message = f"NVRM: Xid (PCI:0000:3b:00): 79, pid={seq + 10000}, GPU has fallen off the bus."
    return format_record(KmsgRecord(0, 4, seq, seq * 1000, "-", message))


class Ring:
    """A kernel-log ring in a file (tests/agent/children/kmsg_crash_agent.py reads it)."""

    def __init__(self, root: Path) -> None:
        self.dev = root / "dev"
        self.proc = root / "proc"
        self.dev.mkdir()
        (self.proc / "sys/kernel/random").mkdir(parents=True)
        (self.proc / "sys/kernel/random/boot_id").write_text(BOOT + "\n")
        self.path = self.dev / "kmsg"
        self.path.write_bytes(b"")
        self.last = 0

    def add(self, count: int) -> None:
        with open(self.path, "ab") as f:
            for _ in range(count):
                self.last += 1
                f.write(xid(self.last))

    def ids(self) -> set[str]:
        return {f"kmsg:{BOOT}:{seq}" for seq in range(1, self.last + 1)}


def run_child(ring: Ring, state: Path, endpoint: str, crash_at: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *(sys.executable, str(CHILD), "--state-dir", str(state)),
            *("--devfs", str(ring.dev), "--procfs", str(ring.proc), "--endpoint", endpoint),
            *("--crash-at-append", str(crash_at)),
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_kill_9_between_collect_and_append_loses_no_kernel_record(tmp_path) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed={seed}")
    rng = random.Random(seed)
    ring = Ring(tmp_path)
    state = tmp_path / "state"
    receiver = OtlpReceiver().start()
    try:
        for cycle in range(4):
            ring.add(rng.randint(6, 14))
            crash_at = 2 if cycle == 0 else rng.randint(1, 3)
            child = run_child(ring, state, receiver.url, crash_at)
            _out, err = child.communicate(timeout=120)
            assert child.returncode == -9, f"cycle {cycle}: the child did not crash: {err}"
        ring.add(3)
        child = run_child(ring, state, receiver.url, 0)
        try:
            deadline = time.monotonic() + 60
            while not ring.ids() <= receiver.ids() and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            child.terminate()
            child.communicate(timeout=30)
        lost = ring.ids() - receiver.ids()
        print(f"records={len(ring.ids())} lost={len(lost)} duplicates={receiver.duplicates}")
        assert not lost, sorted(lost)
    finally:
        receiver.stop()


class ScriptedKmsg(KmsgCollector):
    def __init__(self, state_dir: Path, records: list[bytes]) -> None:
        super().__init__(Roots(), {"start": "persisted", "state_dir": str(state_dir)})
        self.records = records
        self.fd = -1
        self.boot_id = BOOT

    def read_raw(self, limit: int) -> list[bytes]:
        taken, self.records = self.records[:limit], self.records[limit:]
        return taken

    def close(self) -> None:
        self.fd = None


def test_the_kmsg_position_moves_only_when_committed(tmp_path) -> None:
    collector = ScriptedKmsg(tmp_path, [xid(1), xid(2), xid(3)])
    ctx = CollectContext(Roots(), "node7")
    collector.collect(ctx)
    state = tmp_path / "kmsg.json"
    assert not state.exists()  # read, not yet safe: nothing saved
    checkpoint = collector.checkpoint()
    assert checkpoint == (BOOT, 3)
    collector.commit(checkpoint)
    assert state.read_text() == '{"boot_id": "boot-commit-test", "seq": 3}'
    collector.commit((BOOT, 2))  # an older one never moves it back
    assert '"seq": 3' in state.read_text()


def evidence(i: int) -> Evidence:
    return Evidence(f"e{i}", Event(body=f"b{i}"), "sig", "cat", "error")


def test_the_handoff_acks_in_order_only_what_is_written() -> None:
    written: list[str] = []
    acked: list[int] = []
    full = {"now": True}

    def write(batch: list[Evidence]) -> None:
        if full["now"]:
            raise OSError(28, "No space left on device")
        written.extend(e.id for e in batch)

    handoff = Handoff(write)
    assert handoff.submit([evidence(1)], lambda: acked.append(1)) is False
    assert handoff.submit([], lambda: acked.append(2)) is False  # behind poll 1: waits
    assert handoff.submit([evidence(3)], lambda: acked.append(3)) is False
    stats = handoff.stats()
    assert acked == [] and written == [] and stats["writable"] is False
    assert stats["waiting_records"] == 2 and stats["errors_total"] >= 3
    full["now"] = False
    assert handoff.flush() is True
    assert acked == [1, 2, 3] and written == ["e1", "e3"]
    assert handoff.stats()["writable"] is True
    assert handoff.submit([evidence(4)], lambda: acked.append(4)) is True and acked[-1] == 4


def test_the_handoff_bound_drops_the_oldest_and_counts_it() -> None:
    def refuse(batch: list[Evidence]) -> None:
        raise OSError(28, "No space left on device")

    acked: list[int] = []
    handoff = Handoff(refuse, max_waiting=5)
    for i in range(8):
        handoff.submit([evidence(i)], lambda i=i: acked.append(i))
    stats = handoff.stats()
    assert stats["waiting_records"] == 5 and stats["dropped_total"] == 3
    assert acked == [0, 1, 2]  # dropped and counted: their positions may move on


@pytest.mark.skipif(
    not (os.access("/lib/systemd/systemd-journal-remote", os.X_OK)),
    reason="needs systemd-journal-remote (Debian package systemd-journal-remote)",
)
def test_the_journal_cursor_moves_only_when_committed(tmp_path) -> None:
    from denpex.host.journal import JournalCollector
    from tests.host.test_journal import fixture, write_journal

    journal = tmp_path / "x.journal"
    write_journal(journal, fixture("node7-base.export"))
    options = {"file": str(journal), "start": "beginning", "state_dir": str(tmp_path / "state")}

    def poll_all(collector: JournalCollector) -> list[str]:
        bodies: list[str] = []
        deadline = time.monotonic() + 10
        while len(bodies) < 3 and time.monotonic() < deadline:
            ctx = CollectContext(Roots(), "node7")
            bodies += [o.body for o in collector.collect(ctx) if o.kind == "line"]
            time.sleep(0.05)
        return bodies

    first = JournalCollector(Roots(), options)
    try:
        seen = poll_all(first)
    finally:
        first.close()
    assert len(seen) == 3
    again = JournalCollector(Roots(), options)  # nothing committed: all of it again
    try:
        assert poll_all(again) == seen
        again.commit(again.checkpoint())
    finally:
        again.close()
    third = JournalCollector(Roots(), options)
    try:
        time.sleep(0.5)
        leftover = [o for o in third.collect(CollectContext(Roots(), "node7")) if o.kind == "line"]
    finally:
        third.close()
    assert leftover == []
