"""The kernel-log collector: every `/dev/kmsg` record as one `kind="line"` event.

Reads non-blocking, one record per read(), a bounded number per poll; counts the records the
ring overwrote before they were read, and (with a `state_dir`) resumes after a restart on the
same boot without losing a record: the position is saved only when the agent commits it, once
the records up to it are safe (a crash before that reads them again). Never matches
signatures: the agent does.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from denpex.core.collector import CollectContext, Observation
from denpex.core.events import Event, metric
from denpex.core.kmsg import (
    SeqTracker,
    is_test_record,
    monotonic_to_wall_offset_ns,
    parse_record,
)
from denpex.core.roots import Roots, read_text
from denpex.host.base import HostCollector

RECORD_BUFFER = 16384  # the kernel refuses a read() shorter than the record (EINVAL)
STATE_FILE = "kmsg.json"
# EPIPE repositions the reader; a few in a row without a record means something else is wrong
MAX_EPIPE_PER_POLL = 4

# Where kernel messages name the process they are about (OOM killer, Xid, hung task, segfault)
_PID_IN_MESSAGE = re.compile(
    r"Killed process (\d+)|\bpid[=:] ?(\d+)|\btask [^ :]+:(\d+) blocked|^[^ \[]+\[(\d+)\]: segfault"
)
_MEMCG_IN_MESSAGE = re.compile(r"\btask_memcg=([^,\s]+)")


def pid_in_message(message: str) -> int | None:
    """The pid a kernel message is about, for the kinds of message that name one."""
    found = _PID_IN_MESSAGE.search(message)
    if found is None:
        return None
    return int(next(g for g in found.groups() if g is not None))


def attribute_kernel_line(event: Event) -> Event:
    """Name the process (and memory cgroup) a kernel message is about, the OOM victim or the
    Xid's process rather than whoever wrote it; the agent maps them to a job, since the
    subject has often been reaped before anyone reads the record. Every reader of kernel
    lines (/dev/kmsg, the journal's kernel transport) calls this."""
    pid = pid_in_message(event.body)
    if pid is not None:
        event.pid = pid
    memcg = _MEMCG_IN_MESSAGE.search(event.body)
    if memcg:
        event.attrs["cgroup"] = memcg.group(1)
    return event


class KmsgCollector(HostCollector):
    name = "kmsg"
    stability = "stable"
    # a safety net: new records wake a poll at once (wake_when_readable), so the agent sleeps
    # between kernel messages instead of waking four times a second to find none
    default_interval_s = 5.0
    default_budget_s = 0.5
    metrics_help: ClassVar[Mapping[str, str]] = {
        "kmsg_records_total": "Kernel log records read from /dev/kmsg.",
        "kmsg_lost_records_total": (
            "Kernel log records the ring buffer overwrote before they could be read."
        ),
    }

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self.path = roots.dev("kmsg")
        self.fd: int | None = None
        self.tracker = SeqTracker()
        self.records_total = 0
        self.boot_id = "unknown"
        self.state_path: Path | None = None
        if self.options.get("state_dir"):
            self.state_path = Path(self.options["state_dir"], STATE_FILE)
        self._saved: tuple[str, int] | None = None  # (boot id, seq) on disk
        self._state_lock = threading.Lock()  # commit() may come from another thread

    def available(self) -> tuple[bool, str]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            return False, (
                f"cannot open {self.path} ({exc.strerror}): run the agent as root, or set "
                "kernel.dmesg_restrict=0 / grant CAP_SYSLOG"
            )
        os.close(fd)
        return True, f"reads kernel log records from {self.path}"

    def _open(self) -> bool:
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return False
        self.boot_id = (read_text(self.roots.proc("sys/kernel/random/boot_id")) or "").strip()
        self.boot_id = self.boot_id or "unknown"
        saved = self._load_state() if self.options.get("start") == "persisted" else None
        if self.options.get("start") == "persisted" and self.state_path is not None:
            # same boot: resume after the last record delivered; new boot or no state: the
            # whole ring, which holds this boot's records only
            os.lseek(self.fd, 0, os.SEEK_SET)
            if saved is not None and saved.get("boot_id") == self.boot_id:
                self.tracker.last = int(saved["seq"])
                self._saved = (self.boot_id, self.tracker.last)
        else:
            os.lseek(self.fd, 0, os.SEEK_END)
        return True

    def _load_state(self) -> dict | None:
        if self.state_path is None:
            return None
        text = read_text(self.state_path)
        try:
            state = json.loads(text) if text else None
        except ValueError:
            return None
        if not isinstance(state, dict) or not isinstance(state.get("seq"), int):
            return None
        return state

    def checkpoint(self) -> tuple[str, int] | None:
        """(boot id, last seq read): what commit() saves once those records are safe."""
        if self.state_path is None or self.tracker.last is None:
            return None
        return (self.boot_id, self.tracker.last)

    def commit(self, checkpoint: object) -> None:
        assert isinstance(checkpoint, tuple)
        boot_id, seq = str(checkpoint[0]), int(checkpoint[1])
        with self._state_lock:
            saved = self._saved
            if saved is not None and saved[0] == boot_id and saved[1] >= seq:
                return  # never move back
            self._save_state(boot_id, seq)

    def _save_state(self, boot_id: str, seq: int) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_suffix(".tmp")
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"boot_id": boot_id, "seq": seq}))
            os.replace(tmp, self.state_path)
        except OSError:
            return  # an unwritable state dir costs resumption, not collection
        self._saved = (boot_id, seq)

    def read_raw(self, limit: int) -> list[bytes]:
        """Up to `limit` raw records available now (non-blocking)."""
        raws: list[bytes] = []
        epipes = 0
        assert self.fd is not None
        while len(raws) < limit:
            try:
                raw = os.read(self.fd, RECORD_BUFFER)
            except BlockingIOError:
                break
            except OSError as exc:
                # EPIPE: the ring overwrote our position; the reader now points at the oldest
                # record, and the gap in sequence numbers tells how many were lost
                if exc.errno == errno.EPIPE and epipes < MAX_EPIPE_PER_POLL:
                    epipes += 1
                    continue
                break
            if not raw:
                break
            raws.append(raw)
        return raws

    def collect(self, ctx: CollectContext) -> list[Observation]:
        if self.fd is None:
            if not self._open():
                return []
            assert self.fd is not None
            self.wake_when_readable(self.fd)
        limit = int(self.options.get("max_records_per_poll", 10000))
        raws = self.read_raw(limit)
        offset = monotonic_to_wall_offset_ns()
        lost_before = self.tracker.lost
        out: list[Observation] = []
        for raw in raws:
            record = parse_record(raw)
            if record is None or not self.tracker.accept(record.seq):
                continue
            if is_test_record(record.message):
                continue  # a test's injected line, outside a test run
            self.records_total += 1
            attrs: dict[str, object] = {
                "kmsg_seq": record.seq,
                "level": record.level,
                "facility": record.facility,
                "uptime_s": record.usec / 1e6,
                "event_id": f"kmsg:{self.boot_id}:{record.seq}",
            }
            if record.user_space:
                attrs["userspace"] = True  # the name the diagnosis engine trusts less
            if "DEVICE" in record.fields:
                attrs["device"] = record.fields["DEVICE"]
            if "SUBSYSTEM" in record.fields:
                attrs["subsystem"] = record.fields["SUBSYSTEM"]
            event = Event(
                body=record.message,
                ts_ns=record.usec * 1000 + offset,
                host=ctx.host,
                source="kmsg",
                kind="line",
                attrs=attrs,
            )
            out.append(attribute_kernel_line(event))
        lost = self.tracker.lost - lost_before
        if lost:
            out.append(
                Event(
                    body=(
                        f"the kernel log ring overwrote {lost} record(s) before they were read "
                        f"(up to seq {self.tracker.last})"
                    ),
                    ts_ns=ctx.now_ns,
                    host=ctx.host,
                    source="kmsg",
                    kind="state",
                    attrs={"lost_records": lost, "kmsg_seq": self.tracker.last or 0},
                )
            )
        for name, value in (
            ("kmsg_records_total", self.records_total),
            ("kmsg_lost_records_total", self.tracker.lost),
        ):
            out.append(
                metric(name, value, source="kmsg", counter=True, host=ctx.host, ts_ns=ctx.now_ns)
            )
        if len(raws) < limit:  # all read: the watch may sleep until the next record
            self.drained()
        elif self._wake is not None:
            self._wake()  # more than one poll's worth: the next poll comes now
        return out

    def close(self) -> None:
        self.stop_watching()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
