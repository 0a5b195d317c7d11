"""Parses the prefixes real training logs put before a message into Event fields.

Pure functions from one line (bytes, ANSI already stripped) to a `ParsedLine`: torchrun
`[rank3]:`/`[default3]:`, `srun -l` `3: `, pdsh `host: `, ISO/Slurm/syslog/dmesg timestamps,
raw `/dev/kmsg` records and journald JSON. Several prefixes may stack; each is optional.
A log pasted into a bug report or forum post as a Markdown quote (`> `, nested `> > `) is
read as the log it quotes.

This module reads journald JSON and /dev/kmsg records; the prefixes of the text are stripped
by denpex._native.prefixes, compiled, or its regex twin prefixes_ref.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

import denpex._native as native
from denpex._native.prefixes_ref import NOT_HOSTS, iso_time_ns
from denpex.core.kmsg import parse_prefix

_YEAR_IN_TEXT = re.compile(
    rb"\b(20\d\d)-[01]\d-[0-3]\d[T ]|\b[A-Z][a-z]{2} [ 0-9]\d \d\d:\d\d:\d\d (20\d\d)\]"
)
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


def unquote(line: bytes) -> bytes:
    """The line a Markdown quote (`> `, `> > `) holds, as the log printed it."""
    quoted = _QUOTE.match(line)
    return line[quoted.end() :] if quoted else line


# chosen once, at import: parse_line runs for every line a scan reads
_STRIP_PREFIXES = native.load("prefixes").strip_prefixes


def parse_line(line: bytes, year: int | None = None) -> ParsedLine:
    """Split the recognised prefixes of one line off into fields; the rest is the body.

    `year` completes timestamps that carry none (syslog, glog); default: the current year.
    """
    out = ParsedLine(body=line)
    if line[:1] == b"{" and b'"MESSAGE"' in line:
        _parse_journal_json(line, out)
    elif line[:1].isdigit():  # a record starts with its priority: most lines are told at once
        kmsg = parse_prefix(line)
        if kmsg is not None:
            out.source = "kmsg"
            out.attrs.update(kmsg_seq=kmsg.seq, uptime_s=kmsg.usec / 1e6, level=kmsg.prio & 7)
            if kmsg.prio >> 3:  # written from user space, not by the kernel
                out.attrs["userspace"] = True
            out.body = line[kmsg.message_start :]
    (
        start,
        out.ts_ns,
        out.host,
        out.rank,
        out.pid,
        out.source,
        uptime_s,
        log_level,
        cuda_device,
        rank_from_message,
    ) = _STRIP_PREFIXES(out.body, year, out.ts_ns, out.host, out.rank, out.pid, out.source)
    if start:
        out.body = out.body[start:]
    if uptime_s is not None:
        out.attrs["uptime_s"] = uptime_s
    if log_level is not None:
        out.attrs["log_level"] = log_level
    if cuda_device is not None:
        out.attrs["cuda_device"] = cuda_device
    if rank_from_message:
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
        if _HOST_IN_PATH.match(folder) and not NOT_HOSTS.match(folder.encode()):
            host = folder
            break
    return host, rank


def year_in(text: bytes) -> int | None:
    """The first calendar year a chunk of log text states (ISO or `dmesg -T` dates)."""
    found = _YEAR_IN_TEXT.search(text)
    return int(found.group(1) or found.group(2)) if found else None


def iso_to_ns(text: str) -> int | None:
    """UTC ns of an ISO 8601 time such as Slurm's `2026-11-30T04:56:09` (naive = UTC)."""
    return iso_time_ns(text.strip().encode())
