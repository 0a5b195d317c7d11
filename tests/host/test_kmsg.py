"""The kmsg collector: real records injected into /dev/kmsg (root), resumption across a
re-created collector, the per-poll cap, lost-record accounting, and job attribution."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from denpex.core.collector import CollectContext
from denpex.core.kmsg import KmsgRecord, format_record
from denpex.core.roots import Roots
from denpex.host.kmsg import KmsgCollector, pid_in_message
from tests.kernel_log import body_of, inject, marked, needs_kernel_log

XID = b"<4>NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
OOM = (
    b"<3>Out of memory: Killed process 4242 (python) total-vm:1234kB, anon-rss:5678kB, "
    b"file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:100kB oom_score_adj:0\n"
)


def lines(observations) -> list:
    return [o for o in observations if getattr(o, "kind", None) == "line"]


def ctx(roots: Roots | None = None, jobs=()) -> CollectContext:
    return CollectContext(roots=roots or Roots(), host="node7", jobs=jobs)


def collect_and_commit(collector: KmsgCollector, roots: Roots | None = None) -> list:
    """One poll, and the commit the agent makes once its records are spooled."""
    found = collector.collect(ctx(roots))
    checkpoint = collector.checkpoint()
    if checkpoint is not None:
        collector.commit(checkpoint)
    return found


def test_unavailable_without_kmsg_says_what_to_do(tmp_path):
    collector = KmsgCollector(Roots(devfs=str(tmp_path)))
    ok, reason = collector.available()
    assert not ok
    assert "root" in reason and "dmesg_restrict" in reason and "CAP_SYSLOG" in reason
    assert collector.collect(ctx(Roots(devfs=str(tmp_path)))) == []


def test_every_metric_has_help():
    assert set(KmsgCollector.metrics_help) == {"kmsg_records_total", "kmsg_lost_records_total"}
    assert KmsgCollector.stability == "stable"


@pytest.mark.parametrize(
    "message,pid",
    [
        (OOM[3:].decode(), 4242),
        (XID[3:].decode(), 1234),
        ("INFO: task python:31337 blocked for more than 120 seconds.", 31337),
        ("python[777]: segfault at 0 ip 00007f sp 00007ffd error 4 in libc.so.6", 777),
        ("oom-kill:constraint=CONSTRAINT_MEMCG,task_memcg=/job_42,task=python,pid=99,uid=0", 99),
        ("EXT4-fs error (device nvme0n1p1): ext4_find_entry:1455: inode #2", None),
    ],
)
def test_pid_in_message(message, pid):
    assert pid_in_message(message) == pid


class ScriptedKmsg(KmsgCollector):
    """The collector with its read() edge replaced by a list of raw records per poll."""

    def __init__(self, polls: list[list[bytes]]) -> None:
        super().__init__(Roots(), {})
        self.polls = polls
        self.fd = -1  # "opened"

    def read_raw(self, limit: int) -> list[bytes]:
        return self.polls.pop(0)[:limit]

    def close(self) -> None:
        self.fd = None


def _raw(seq: int, message: str = "x") -> bytes:
    return format_record(KmsgRecord(0, 6, seq, seq * 10, "-", message))


def test_a_gap_in_seq_is_counted_as_lost_and_reported():
    collector = ScriptedKmsg([[_raw(5), _raw(6)], [_raw(10), _raw(11)], [_raw(11), _raw(12)]])
    first = collector.collect(ctx())
    assert [e.attrs["kmsg_seq"] for e in lines(first)] == [5, 6]
    second = collector.collect(ctx())
    state = [o for o in second if o.kind == "state"]
    assert len(state) == 1 and state[0].attrs["lost_records"] == 3
    lost = [o for o in second if o.kind == "metric" and o.body == "kmsg_lost_records_total"]
    assert lost[0].attrs["value"] == 3.0 and lost[0].attrs["type"] == "counter"
    third = collector.collect(ctx())  # a repeated record is not delivered twice
    assert [e.attrs["kmsg_seq"] for e in lines(third)] == [12]
    assert not [o for o in third if o.kind == "state"]


@needs_kernel_log
def test_injected_xid_and_oom_lines_arrive_with_seq_and_time():
    collector = KmsgCollector(Roots())
    assert collector.available()[0]
    try:
        collector.collect(ctx())  # opens at the end of the ring
        inject(XID, OOM)
        written_ns = time.time_ns()
        events = lines(collector.collect(ctx()))
    finally:
        collector.close()
    xid = [e for e in events if e.body == body_of(marked(XID))]
    oom = [e for e in events if e.body == body_of(marked(OOM))]
    assert len(xid) >= 1 and len(oom) >= 1
    xid_event, oom_event = xid[-1], oom[-1]
    assert xid_event.attrs["kmsg_seq"] < oom_event.attrs["kmsg_seq"]
    for event, level in ((xid_event, 4), (oom_event, 3)):
        assert event.source == "kmsg" and event.host == "node7"
        assert abs(event.ts_ns - written_ns) < 1_000_000_000
        assert event.attrs["level"] == level and event.attrs["facility"] == 1
        assert event.attrs["userspace"] is True  # written from user space, trusted less
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        assert event.attrs["event_id"] == f"kmsg:{boot_id}:{event.attrs['kmsg_seq']}"
    # the subject of each message, which the agent's job table attributes
    assert (xid_event.pid, oom_event.pid) == (1234, 4242)


@needs_kernel_log
def test_restart_with_persisted_position_loses_and_repeats_nothing(tmp_path):
    options = {"start": "persisted", "state_dir": str(tmp_path), "max_records_per_poll": 100000}
    first = KmsgCollector(Roots(), options)
    before = lines(collect_and_commit(first))  # no saved state: the whole ring
    inject(b"<6>denpex-persist-one\n")
    seen_one = lines(collect_and_commit(first))
    last_seq = first.tracker.last
    first.close()
    assert any(e.body == body_of(marked(b"<6>denpex-persist-one")) for e in seen_one)
    assert before and all(e.attrs["kmsg_seq"] <= last_seq for e in before + seen_one)

    inject(b"<6>denpex-persist-two\n", b"<6>denpex-persist-three\n")  # while nothing reads
    second = KmsgCollector(Roots(), options)
    resumed = second.collect(ctx())
    second.close()
    seqs = [e.attrs["kmsg_seq"] for e in lines(resumed)]
    assert seqs and min(seqs) == last_seq + 1  # the next record, none repeated
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # none skipped
    bodies = [e.body for e in lines(resumed)]
    assert body_of(marked(b"<6>denpex-persist-two")) in bodies
    assert body_of(marked(b"<6>denpex-persist-three")) in bodies
    assert body_of(marked(b"<6>denpex-persist-one")) not in bodies
    assert second.tracker.lost == 0


@needs_kernel_log
def test_a_new_boot_id_reads_the_ring_from_the_beginning(tmp_path):
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text("boot-a\n")
    roots = Roots(procfs=str(proc))
    options = {"start": "persisted", "state_dir": str(tmp_path / "state")}
    first = KmsgCollector(roots, options)
    collect_and_commit(first, roots)
    inject(b"<6>denpex-boot-a\n")
    collect_and_commit(first, roots)
    saved = first.tracker.last
    first.close()
    (proc / "sys/kernel/random/boot_id").write_text("boot-b\n")
    second = KmsgCollector(roots, options)
    events = lines(second.collect(ctx(roots)))
    second.close()
    assert min(e.attrs["kmsg_seq"] for e in events) < saved  # not resumed: a different boot
    assert all(e.attrs["event_id"].startswith("kmsg:boot-b:") for e in events)


@needs_kernel_log
def test_records_per_poll_are_capped_and_the_rest_come_next_poll(tmp_path):
    options = {"start": "persisted", "state_dir": str(tmp_path), "max_records_per_poll": 5}
    collector = KmsgCollector(Roots(), options)
    try:
        first = [e.attrs["kmsg_seq"] for e in lines(collector.collect(ctx()))]
        second = [e.attrs["kmsg_seq"] for e in lines(collector.collect(ctx()))]
    finally:
        collector.close()
    assert len(first) == 5 and len(second) == 5
    assert second[0] == first[-1] + 1


@pytest.mark.slow  # floods the shared kernel ring: other kernel-log readers lose records
@needs_kernel_log
def test_overwritten_records_are_counted_for_real():
    collector = KmsgCollector(Roots())
    try:
        collector.collect(ctx())
        inject(b"<6>denpex-before-flood\n")
        collector.collect(ctx())
        filler = b"<6>denpex-flood " + b"x" * 900 + b"\n"
        started = time.monotonic()
        inject(*[filler] * 2000)  # ~2 MB: more than the ring holds
        flood_s = time.monotonic() - started
        observations = collector.collect(ctx())
    finally:
        collector.close()
    state = [o for o in observations if o.kind == "state"]
    assert state and state[0].attrs["lost_records"] > 0, f"flood took {flood_s:.2f}s"
    lost = [o for o in observations if o.body == "kmsg_lost_records_total"]
    assert lost[0].attrs["value"] == state[0].attrs["lost_records"]


@needs_kernel_log
def test_a_new_record_wakes_a_poll_at_once():
    # the interval is only a safety net: the kernel writing a record asks for the next poll
    collector = KmsgCollector(Roots())
    woken = threading.Event()
    collector.set_waker(woken.set)
    try:
        collector.collect(ctx())  # opens /dev/kmsg and starts watching it
        woken.clear()
        inject(XID)
        assert woken.wait(1.0), "no wake-up within 1 s of the record"
        assert any(e.body == body_of(marked(XID)) for e in lines(collector.collect(ctx())))
        woken.clear()
        assert not woken.wait(0.3)  # drained: nothing new, no wake-up
    finally:
        collector.close()
