"""Parses the prefixes real training logs put before a message into Event fields.

Pure functions from one line (bytes, ANSI already stripped) to a `ParsedLine`: torchrun
`[rank3]:`/`[default3]:`, `srun -l` `3: `, pdsh `host: `, ISO/Slurm/syslog/dmesg timestamps,
raw `/dev/kmsg` records and journald JSON. Several prefixes may stack; each is optional.
A log pasted into a bug report or forum post as a Markdown quote (`> `, nested `> > `) is
read as the log it quotes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from denpex.core.kmsg import parse_prefix

_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1
    )
}

_DMESG = re.compile(rb"^\[ {0,12}(\d{1,10}\.\d{1,9})\] ?")
_DMESG_T = re.compile(
    rb"^\[(?:[A-Z][a-z]{2} )?([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})\] ?"
)
_SYSLOG = re.compile(
    rb"^([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d) ([A-Za-z0-9][A-Za-z0-9_.-]{0,62}) "
    rb"([A-Za-z0-9_./-]{1,48})(?:\[(\d{1,10})\])?: ?"
)
_ISO = re.compile(
    rb"^\[?(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?"
    rb"(Z|[+-]\d\d:?\d\d)?\]?(?: |$)"
)
_ISO_SYSLOG_TAIL = re.compile(
    rb"^([a-z0-9][a-z0-9_.-]{0,62}) ([A-Za-z0-9_./-]{1,48})(?:\[(\d{1,10})\])?: ?"
)
# c10 logging `[E914 13:34:42.100231874 File.cpp:616]` (month*100+day, ns, no thread id) and
# Python/glog `E0130 12:10:04.010000 90211 path.py:869]` (zero-padded, with thread id)
_GLOG = re.compile(
    rb"^\[?([IWEF])(\d{3,4}) (\d\d):(\d\d):(\d\d)\.(\d{1,9})(?: {1,8}\d{1,10})? [^ \]\n]{1,200}\] ?"
)
# `[rank3]:` carries the global rank; `[default3]:` (torchrun --tee, role "default") the
# local one, which a following `[rank11]:` replaces
_TORCHRUN = re.compile(rb"^\[(rank|default|trainer|worker)(\d{1,6})\]: ?")
_SRUN = re.compile(rb"^(\d{1,6}): ")
# `kubectl logs --prefix`: "[pod/NAME/CONTAINER] " (or without brackets): the pod is the host
_KUBECTL = re.compile(rb"^\[?pod/([a-z0-9][a-z0-9.-]{0,252})(?:/[a-z0-9-]{1,63})?\]? ")
# Open MPI `mpirun --tag-output`: "[jobid,rank]<stdout>:"
_MPIRUN = re.compile(rb"^\[\d{1,6},(\d{1,6})\]<(?:stdout|stderr|stddiag)>: ?")
# horovodrun's own (gloo) launcher: "[rank]<stdout>:", after time.asctime() with
# --prefix-output-with-timestamp ("Fri Sep 25 16:52:53 2020[1]<stderr>:")
_HOROVOD_RANK = re.compile(
    rb"^(?:[A-Z][a-z]{2} ([A-Z][a-z]{2}) {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4}))?"
    rb"\[(\d{1,6})\]<(?:stdout|stderr)>: ?"
)
# TensorFlow / XLA C++ logging (tsl): "2024-07-29 17:14:59.920189: E rendezvous.cc:38] ", and
# Horovod's own "[2024-07-29 17:14:59.920189: W stall_inspector.cc:107] "; both local time
_TSL_LOG = re.compile(
    rb"^\[?(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{1,9}): ([TDIWEF]) [^ \]\n]{1,300}\] ?"
)
_HOST = re.compile(rb"^([a-z][a-z0-9-]{0,40}[0-9][a-z0-9-]{0,20}(?:\.[a-z0-9-]{1,63}){0,6}): ")
# a host name without digits (node-a, login) only counts before another known prefix
_HOST_BEFORE_PREFIX = re.compile(
    rb"^([a-z][a-z0-9-]{0,62}(?:\.[a-z0-9-]{1,63}){0,6}): (?=\[(?:rank|default)\d|\d{1,6}: |\d{4}-\d\d-\d\d|[A-Za-z0-9_.-]{1,63}:\d{1,10}:\d{1,10} \[)"
)
_NOT_HOSTS = re.compile(
    rb"^(?:rank|default|step|epoch|iter|iteration|gpu|cuda|device|worker|layer"
    rb"|batch|node_rank|local_rank|task|proc|cpu|shard|run|job|exp|trial|test|attempt|try|logs?"
    rb"|out|output|v|version|ckpt|checkpoint|model)[_-]?\d",
    re.IGNORECASE,
)
_NCCL_HOST = re.compile(rb"^([A-Za-z0-9][A-Za-z0-9_.-]{0,62}):(\d{1,10}):(\d{1,10}) \[(\d{1,3})\] ")
_YEAR_IN_TEXT = re.compile(
    rb"\b(20\d\d)-[01]\d-[0-3]\d[T ]|\b[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d (20\d\d)\]"
)
_RANK_IN_BODY = re.compile(rb"\[Rank (\d{1,6})\]")
# a Markdown quote marker ("> ", "> > ", a bare ">" on an empty quoted line), never the
# prompts ">>> " of a Python shell or "->"
_QUOTE = re.compile(rb"^(?:>(?: |$)){1,8}")


@dataclass(slots=True)
class ParsedLine:
    body: bytes
    ts_ns: int | None = None
    host: str | None = None
    rank: int | None = None
    pid: int | None = None
    source: str = "log"
    attrs: dict[str, Any] = field(default_factory=dict)


def _to_ns(dt: datetime, frac: bytes | None = None) -> int:
    ns = int(dt.timestamp()) * 1_000_000_000
    if frac:
        ns += int(frac.ljust(9, b"0")[:9])
    return ns


def _tz(offset: bytes | None):
    if not offset or offset == b"Z":
        return UTC
    text = offset.decode().replace(":", "")
    return datetime.strptime(text, "%z").tzinfo


def _utc_ns(
    year: int,
    month: int,
    day: int,
    hh: int,
    mm: int,
    ss: int,
    frac: bytes | None = None,
    offset: bytes | None = None,
) -> int | None:
    """UTC ns of a stated time, or None when the fields name no real instant (Feb 29 of a
    common year, day 32, hour 24, a bad offset): the line is still a line, only untimed. A
    leap second (:60) counts as the last second of its minute."""
    try:
        dt = datetime(year, month, day, hh, mm, 59 if ss == 60 else ss, tzinfo=_tz(offset))
        return _to_ns(dt, frac)
    except (ValueError, OverflowError):
        return None


def _iso_groups_to_ns(groups) -> int | None:
    """UTC ns from the groups of `_ISO` (year … seconds, fraction, offset); None if invalid."""
    yy, mon, day, hh, mm, ss, frac, offset = groups
    return _utc_ns(int(yy), int(mon), int(day), int(hh), int(mm), int(ss), frac, offset)


def _year_now() -> int:
    return datetime.now(UTC).year


def _parse_journal_json(line: bytes, out: ParsedLine) -> bool:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(record, dict) or "MESSAGE" not in record:
        return False
    message = record["MESSAGE"]
    if isinstance(message, list):  # journald exports non-UTF-8 messages as byte arrays
        message = bytes(b & 0xFF for b in message if isinstance(b, int)).decode("utf-8", "replace")
    out.body = str(message).encode("utf-8", "replace")
    realtime = record.get("__REALTIME_TIMESTAMP")
    if isinstance(realtime, str) and realtime.isdigit():
        out.ts_ns = int(realtime) * 1000
    host = record.get("_HOSTNAME")
    if isinstance(host, str) and host:
        out.host = host
    pid = record.get("_PID")
    if isinstance(pid, str) and pid.isdigit():
        out.pid = int(pid)
    kernel = record.get("_TRANSPORT") == "kernel" or record.get("SYSLOG_IDENTIFIER") == "kernel"
    out.source = "kmsg" if kernel else "journal"
    return True


def _strip_leading(out: ParsedLine, year: int | None) -> bool:
    """Remove one recognised prefix from out.body; False when none applies."""
    body = out.body
    # every prefix starts with `[`, a digit or a letter, and only a host name (or kubectl's
    # `pod/`) with a small letter: most lines are told apart by their first byte
    first = body[:1]
    if first.islower():
        return out.host is None and _strip_host(out, body)
    if not (first == b"[" or first.isalnum()):
        return False
    if out.ts_ns is None and out.source == "log":
        found = _DMESG.match(body)
        if found:
            out.source = "kmsg"
            out.attrs["uptime_s"] = float(found.group(1))
            out.body = body[found.end() :]
            return True
        found = _DMESG_T.match(body)
        if found and found.group(1) in (m.encode() for m in _MONTHS):
            mon, day, hh, mm, ss, yy = found.groups()
            out.ts_ns = _utc_ns(int(yy), _MONTHS[mon.decode()], int(day), int(hh), int(mm), int(ss))
            out.source, out.body = "kmsg", body[found.end() :]
            return True
        found = _SYSLOG.match(body)
        if found and found.group(1).decode() in _MONTHS:
            mon, day, hh, mm, ss, host, tag, pid = found.groups()
            out.ts_ns = _utc_ns(
                year or _year_now(), _MONTHS[mon.decode()], int(day), int(hh), int(mm), int(ss)
            )
            out.host = host.decode()
            out.source = "kmsg" if tag == b"kernel" else "syslog"
            if pid:
                out.pid = int(pid)
            out.body = body[found.end() :]
            if out.source == "kmsg":  # a kernel line keeps its own [uptime] prefix
                inner = _DMESG.match(out.body)
                if inner:
                    out.attrs["uptime_s"] = float(inner.group(1))
                    out.body = out.body[inner.end() :]
            return True
    if out.ts_ns is None:
        found = _TSL_LOG.match(body)
        if found:
            # an impossible date leaves the line untimed, its prefix still stripped
            out.ts_ns = _iso_groups_to_ns((*found.groups()[:7], None))
            out.body = body[found.end() :]
            out.attrs["log_level"] = found.group(8).decode()
            return True
        found = _ISO.match(body)
        if found:
            out.ts_ns = _iso_groups_to_ns(found.groups())
            out.body = body[found.end() :]
            if out.body.startswith(b"- "):  # Python logging's "%(asctime)s - %(name)s - …"
                out.body = out.body[2:]
            tail = _ISO_SYSLOG_TAIL.match(out.body) if out.source == "log" else None
            # RFC 5424-style syslog: "<time> <host> <tag>[pid]: message"; a bare word and a
            # colon is too common in log text, so the tag must be a daemon we know or carry a pid
            known_tag = tail is not None and tail.group(2) in (b"kernel", b"slurmd", b"slurmstepd")
            if tail and out.host is None and (known_tag or tail.group(3)):
                out.host = tail.group(1).decode()
                out.source = "kmsg" if tail.group(2) == b"kernel" else "syslog"
                if tail.group(3):
                    out.pid = int(tail.group(3))
                out.body = out.body[tail.end() :]
            return True
    found = _GLOG.match(body)
    if found:
        level, monthday, hh, mm, ss, frac = found.groups()
        month, day = divmod(int(monthday), 100)
        if out.ts_ns is None:
            out.ts_ns = _utc_ns(year or _year_now(), month, day, int(hh), int(mm), int(ss), frac)
        out.body = body[found.end() :]
        out.attrs["log_level"] = level.decode()
        return True
    found = _TORCHRUN.match(body)
    # `[rank11]:` names the global rank, so it replaces a local `[default3]:` or `srun -l` id
    if found and (out.rank is None or found.group(1) == b"rank"):
        out.rank, out.body = int(found.group(2)), body[found.end() :]
        return True
    if out.rank is None:
        found = _SRUN.match(body) or _MPIRUN.match(body)
        if found:
            out.rank, out.body = int(found.group(1)), body[found.end() :]
            return True
        found = _HOROVOD_RANK.match(body)
        if found:
            mon, day, hh, mm, ss, yy, rank = found.groups()
            if yy and out.ts_ns is None and mon.decode() in _MONTHS:
                out.ts_ns = _utc_ns(
                    int(yy), _MONTHS[mon.decode()], int(day), int(hh), int(mm), int(ss)
                )
            out.rank, out.body = int(rank), body[found.end() :]
            return True
    return out.host is None and _strip_host(out, body)


def _strip_host(out: ParsedLine, body: bytes) -> bool:
    """Remove a host prefix (kubectl's pod, pdsh's `host: `) from out.body."""
    found = _KUBECTL.match(body)
    if found:
        out.host, out.body = found.group(1).decode(), body[found.end() :]
        return True
    found = _HOST.match(body) or _HOST_BEFORE_PREFIX.match(body)
    if found and not _NOT_HOSTS.match(body):
        out.host, out.body = found.group(1).decode(), body[found.end() :]
        return True
    return False


def unquote(line: bytes) -> bytes:
    """The line a Markdown quote (`> `, `> > `) holds, as the log printed it."""
    quoted = _QUOTE.match(line)
    return line[quoted.end() :] if quoted else line


def parse_line(line: bytes, year: int | None = None) -> ParsedLine:
    """Split the recognised prefixes of one line off into fields; the rest is the body.

    `year` completes timestamps that carry none (syslog, glog); default: the current year.
    """
    out = ParsedLine(body=line)
    if line[:1] == b"{" and b'"MESSAGE"' in line:
        _parse_journal_json(line, out)
    else:
        kmsg = parse_prefix(line)
        if kmsg is not None:
            out.source = "kmsg"
            out.attrs.update(kmsg_seq=kmsg.seq, uptime_s=kmsg.usec / 1e6, level=kmsg.prio & 7)
            if kmsg.prio >> 3:  # written from user space, not by the kernel
                out.attrs["userspace"] = True
            out.body = line[kmsg.message_start :]
    for _ in range(6):
        if not _strip_leading(out, year):
            break
    if out.host is None or out.pid is None:
        nccl = _NCCL_HOST.match(out.body)
        if nccl:
            out.host = out.host or nccl.group(1).decode()
            out.pid = out.pid or int(nccl.group(2))
            out.attrs["cuda_device"] = int(nccl.group(4))
    if out.rank is None:
        found = _RANK_IN_BODY.search(out.body)
        if found:
            out.rank = int(found.group(1))
            out.attrs["rank_from_message"] = True
    return out


_RANK_IN_PATH = re.compile(r"(?:^|[^a-z])rank[_-]?(\d{1,6})(?:[^0-9]|$)", re.IGNORECASE)
_HOST_IN_PATH = re.compile(r"^[a-z][a-z0-9-]{0,40}[0-9][a-z0-9-]{0,20}(?:\.[a-z0-9-]{1,63}){0,6}$")


def hints_from_path(path: str) -> tuple[str | None, int | None]:
    """(host, rank) suggested by a log file's path, e.g. `node7/rank3.log` → ('node7', 3).

    The rank comes from a `rankN` in the file name; the host from the nearest folder whose
    name looks like a host name (letters then a digit: node7, gpu-a100-03).
    """
    parts = path.replace("\\", "/").split("/")
    found = _RANK_IN_PATH.search(parts[-1])
    rank = int(found.group(1)) if found else None
    host = None
    for folder in reversed(parts[:-1]):
        if _HOST_IN_PATH.match(folder) and not _NOT_HOSTS.match(folder.encode()):
            host = folder
            break
    return host, rank


def year_in(text: bytes) -> int | None:
    """The first calendar year a chunk of log text states (ISO or `dmesg -T` dates)."""
    found = _YEAR_IN_TEXT.search(text)
    return int(found.group(1) or found.group(2)) if found else None


def iso_to_ns(text: str) -> int | None:
    """UTC ns of an ISO 8601 time such as Slurm's `2026-11-30T04:56:09` (naive = UTC)."""
    found = _ISO.match(text.strip().encode())
    return _iso_groups_to_ns(found.groups()) if found else None
