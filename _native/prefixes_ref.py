"""The prefixes real training logs put before a message, stripped with regexes: the pure-Python
twin of `denpex._native.prefixes`, its test oracle, and what `denpex._native.load("prefixes")`
returns when the extension is not built.

torchrun `[rank3]:`/`[default3]:`, `srun -l` `3: `, mpirun and horovod ranks, pdsh and kubectl
hosts, ISO/syslog/dmesg/glog/c10/TensorFlow timestamps and NCCL's `host:pid:tid [dev]`; several
may stack, each is optional. denpex.lite.prefixes reads journald JSON and /dev/kmsg records
first and builds its ParsedLine from what `strip_prefixes` returns; this module holds only the
algorithm and must never import denpex.lite (the native layer is the lowest). It never raises on
any bytes.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

# what strip_prefixes returns: where the body starts in the text it was given, ts_ns, host,
# rank, pid, source, then the attrs it found (None where not): uptime_s, log_level, cuda_device,
# and whether the rank was read off the message
Stripped = tuple[
    int,
    int | None,
    str | None,
    int | None,
    int | None,
    str,
    float | None,
    str | None,
    int | None,
    bool,
]

fallbacks = 0  # calls the compiled module hands to this twin; none here

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
# words with a number that name no host (`rank3: `, `step_5: `); denpex.lite.prefixes reads
# log paths with it too
NOT_HOSTS = re.compile(
    rb"^(?:rank|default|step|epoch|iter|iteration|gpu|cuda|device|worker|layer"
    rb"|batch|node_rank|local_rank|task|proc|cpu|shard|run|job|exp|trial|test|attempt|try|logs?"
    rb"|out|output|v|version|ckpt|checkpoint|model)[_-]?\d",
    re.IGNORECASE,
)
_NCCL_HOST = re.compile(rb"^([A-Za-z0-9][A-Za-z0-9_.-]{0,62}):(\d{1,10}):(\d{1,10}) \[(\d{1,3})\] ")
_RANK_IN_BODY = re.compile(rb"\[Rank (\d{1,6})\]")


class _Line:
    """The fields of one line as its prefixes are stripped off (the body shrinks from the left)."""

    __slots__ = (
        "body",
        "cuda_device",
        "host",
        "log_level",
        "pid",
        "rank",
        "rank_from_message",
        "source",
        "ts_ns",
        "uptime_s",
    )  # fmt: skip

    def __init__(
        self,
        body: bytes,
        ts_ns: int | None,
        host: str | None,
        rank: int | None,
        pid: int | None,
        source: str,
    ) -> None:
        self.body = body
        self.ts_ns = ts_ns
        self.host = host
        self.rank = rank
        self.pid = pid
        self.source = source
        self.uptime_s: float | None = None
        self.log_level: str | None = None
        self.cuda_device: int | None = None
        self.rank_from_message = False


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


def iso_time_ns(text: bytes) -> int | None:
    """UTC ns of the ISO 8601 time `text` starts with (naive = UTC), or None."""
    found = _ISO.match(text)
    return _iso_groups_to_ns(found.groups()) if found else None


def strip_prefixes(
    body: bytes,
    year: int | None,
    ts_ns: int | None,
    host: str | None,
    rank: int | None,
    pid: int | None,
    source: str,
) -> Stripped:
    """Strip the recognised prefixes off `body`, given the fields already known (a journal
    record's time, host and pid, a kmsg record's source).

    `year` completes timestamps that carry none (syslog, glog); None or 0: the current year.
    Every body this leaves is a suffix of `body`: the result says where it starts.
    """
    out = _Line(body, ts_ns, host, rank, pid, source)
    for _ in range(6):
        if not _strip_leading(out, year):
            break
    if out.host is None or out.pid is None:
        nccl = _NCCL_HOST.match(out.body)
        if nccl:
            out.host = out.host or nccl.group(1).decode()
            out.pid = out.pid or int(nccl.group(2))
            out.cuda_device = int(nccl.group(4))
    if out.rank is None:
        found = _RANK_IN_BODY.search(out.body)
        if found:
            out.rank = int(found.group(1))
            out.rank_from_message = True
    return (
        len(body) - len(out.body),
        out.ts_ns,
        out.host,
        out.rank,
        out.pid,
        out.source,
        out.uptime_s,
        out.log_level,
        out.cuda_device,
        out.rank_from_message,
    )


def _strip_leading(out: _Line, year: int | None) -> bool:
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
            out.uptime_s = float(found.group(1))
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
                    out.uptime_s = float(inner.group(1))
                    out.body = out.body[inner.end() :]
            return True
    if out.ts_ns is None:
        found = _TSL_LOG.match(body)
        if found:
            # an impossible date leaves the line untimed, its prefix still stripped
            out.ts_ns = _iso_groups_to_ns((*found.groups()[:7], None))
            out.body = body[found.end() :]
            out.log_level = found.group(8).decode()
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
        out.log_level = level.decode()
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


def _strip_host(out: _Line, body: bytes) -> bool:
    """Remove a host prefix (kubectl's pod, pdsh's `host: `) from out.body."""
    found = _KUBECTL.match(body)
    if found:
        out.host, out.body = found.group(1).decode(), body[found.end() :]
        return True
    found = _HOST.match(body) or _HOST_BEFORE_PREFIX.match(body)
    if found and not NOT_HOSTS.match(body):
        out.host, out.body = found.group(1).decode(), body[found.end() :]
        return True
    return False
