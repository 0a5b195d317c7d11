"""The `/dev/kmsg` record format: one parser for the whole code base (pure, no I/O).

A record is `prio,seq,usec,flags[,more];message` then optional dictionary lines
(` SUBSYSTEM=pci`, ` DEVICE=+pci:0000:3b:00.0`). The kernel escapes every byte below 0x20,
at or above 0x7f, and the backslash itself as `\\xNN`; `parse_record` undoes it.

Which clock `usec` follows: the kernel stamps records with `local_clock()`, which (like
CLOCK_MONOTONIC, unlike CLOCK_BOOTTIME) does not advance while the machine is suspended.
Checked on kernel 6.18 by writing a record and reading CLOCK_MONOTONIC around it: the usec
lay within 1 ms of CLOCK_MONOTONIC (local_clock drifted ~0.7 ms from it after 2 h uptime), so
`wall_ns_from_usec` maps through CLOCK_MONOTONIC. Never add I/O here: callers read the file.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import NamedTuple

# Same acceptance as the line scanner always had: flags plus any extra fields (`caller=`)
# up to the `;` that starts the message.
_PREFIX = re.compile(rb"^(\d{1,4}),(\d{1,20}),(\d{1,20}),([^;\n]{0,32});")
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
# What the kernel escapes in message text and dictionary values (kernel/printk/printk.c)
_NEEDS_ESCAPE = re.compile(rb"[\x00-\x1f\x7f-\xff\\]")


# Every line a test writes into the real kernel log carries this marker; outside a test run
# (DENPEX_TEST_KMSG unset) denpex ignores such records, so a test's fake Xid or OOM line can
# never become a diagnosis, and a site's own health checks can key on the marker too.
TEST_MARKER = "denpex-test-injected"
TEST_KMSG_ENV = "DENPEX_TEST_KMSG"


def is_test_record(message: str) -> bool:
    """True for a test's injected kernel-log line when no test run asked for them."""
    return TEST_MARKER in message and os.environ.get(TEST_KMSG_ENV) != "1"


class KmsgPrefix(NamedTuple):
    """The fields before the `;` of a record, and where the message starts."""

    prio: int
    seq: int
    usec: int
    flags: str
    message_start: int


@dataclass(slots=True)
class KmsgRecord:
    """One kernel log record. `facility` 0 is the kernel; anything else was written from
    user space (e.g. into /dev/kmsg) and deserves less trust. `flags` is `-`, or `c` for a
    record continued by the next one. `fields` are the dictionary lines (SUBSYSTEM, DEVICE)."""

    facility: int
    level: int
    seq: int
    usec: int
    flags: str
    message: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def user_space(self) -> bool:
        return self.facility != 0


def parse_prefix(line: bytes) -> KmsgPrefix | None:
    """The record prefix of one line, or None when the line does not start with one."""
    found = _PREFIX.match(line)
    if found is None:
        return None
    prio, seq, usec = (int(g) for g in found.group(1, 2, 3))
    flags = found.group(4).split(b",", 1)[0].decode("ascii", "replace") or "-"
    return KmsgPrefix(prio, seq, usec, flags, found.end())


def unescape(data: bytes) -> bytes:
    """Undo the kernel's `\\xNN` escaping (a literal backslash arrives as `\\x5c`)."""
    if b"\\x" not in data:
        return data
    return _ESCAPE.sub(lambda m: bytes((int(m.group(1), 16),)), data)


def escape(data: bytes) -> bytes:
    """The kernel's escaping of message text and dictionary values (inverse of `unescape`)."""
    return _NEEDS_ESCAPE.sub(lambda m: b"\\x%02x" % m.group(0)[0], data)


def _text(data: bytes) -> str:
    return unescape(data).decode("utf-8", "replace")


def parse_record(raw: bytes) -> KmsgRecord | None:
    """One record as one `read()` of /dev/kmsg returns it; None when it is not a record."""
    prefix = parse_prefix(raw)
    if prefix is None:
        return None
    head, _, rest = raw[prefix.message_start :].partition(b"\n")
    fields: dict[str, str] = {}
    for line in rest.split(b"\n"):
        if line[:1] != b" ":  # dictionary lines start with one space; the rest is padding
            continue
        key, sep, value = line[1:].partition(b"=")
        if sep and key:
            fields[key.decode("ascii", "replace")] = _text(value)
    return KmsgRecord(
        facility=prefix.prio >> 3,
        level=prefix.prio & 7,
        seq=prefix.seq,
        usec=prefix.usec,
        flags=prefix.flags,
        message=_text(head),
        fields=fields,
    )


def format_record(record: KmsgRecord) -> bytes:
    """The bytes the kernel would hand out for `record` (for fixtures and round-trip tests)."""
    prio = (record.facility << 3) | record.level
    out = [
        b"%d,%d,%d,%s;" % (prio, record.seq, record.usec, record.flags.encode("ascii"))
        + escape(record.message.encode("utf-8"))
    ]
    for key, value in record.fields.items():
        out.append(b" " + key.encode("ascii") + b"=" + escape(value.encode("utf-8")))
    return b"\n".join(out) + b"\n"


def monotonic_to_wall_offset_ns() -> int:
    """Wall-clock ns minus CLOCK_MONOTONIC ns, read now (the wall clock may be stepped by NTP,
    so take it again for every batch of records rather than once at start)."""
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    wall = time.time_ns()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return wall - (before + after) // 2


def wall_ns_from_usec(usec: int, offset_ns: int | None = None) -> int:
    """UTC ns of a record's usec (microseconds of CLOCK_MONOTONIC, see the module docstring);
    `offset_ns` from `monotonic_to_wall_offset_ns()`, taken now when omitted."""
    if offset_ns is None:
        offset_ns = monotonic_to_wall_offset_ns()
    return usec * 1000 + offset_ns


@dataclass(slots=True)
class SeqTracker:
    """Follows record sequence numbers: a jump forward means the ring overwrote records
    before they were read (they are counted as lost); a number at or below the last one
    seen is a record already delivered (after a restart from a saved position)."""

    last: int | None = None
    lost: int = 0

    def accept(self, seq: int) -> bool:
        """True when the record is new; counts the records skipped before it in `lost`."""
        if self.last is not None:
            if seq <= self.last:
                return False
            self.lost += seq - self.last - 1
        self.last = seq
        return True
