"""The journald collector: entries of the system journal, a journal file or a directory.

Runs one long-lived `journalctl -o json --follow` and reads its output non-blocking each
poll (a bounded number of entries); the cursor of the last entry is kept in `state_dir` once
the agent commits it (the entries up to it are safe), so a restart loses no entry and repeats
only those not yet committed. Never blocks a poll on journalctl and never leaves it behind as
a zombie.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import orjson

import denpex._native as native
from denpex.core.collector import CollectContext, Observation
from denpex.core.events import Event, metric
from denpex.core.roots import Roots, read_text
from denpex.host.base import HostCollector
from denpex.host.kmsg import attribute_kernel_line

STATE_FILE = "journal.json"
READ_CHUNK = 65536
STDERR_KEPT = 2048
ENTRY_CAP = 1 << 20  # one journal entry as JSON; MESSAGE fields are capped far below this


def journal_message(value: Any) -> str | None:
    """MESSAGE as text: journald writes non-UTF-8 messages as a JSON array of byte values."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        data = bytes(b & 0xFF for b in value if isinstance(b, int))
        return data.decode("utf-8", "replace")
    return None


def parse_entry(line: bytes) -> dict[str, Any] | None:
    """One line of `journalctl -o json`, or None when it is not an entry with a message."""
    try:
        entry = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(entry, dict) or journal_message(entry.get("MESSAGE")) is None:
        return None
    return entry


def _digits(value: Any) -> int | None:
    return int(value) if isinstance(value, str) and value.isdigit() else None


def entry_event(entry: dict[str, Any], host: str) -> Event:
    """The line event of one parsed journal entry."""
    kernel = entry.get("_TRANSPORT") == "kernel"
    realtime_us = _digits(entry.get("__REALTIME_TIMESTAMP"))
    attrs: dict[str, Any] = {}
    for attr, key in (
        ("unit", "_SYSTEMD_UNIT"),
        ("identifier", "SYSLOG_IDENTIFIER"),
        ("hostname", "_HOSTNAME"),
        ("transport", "_TRANSPORT"),
        ("device", "_KERNEL_DEVICE"),
        ("subsystem", "_KERNEL_SUBSYSTEM"),
    ):
        if isinstance(entry.get(key), str):
            attrs[attr] = entry[key]
    priority = _digits(entry.get("PRIORITY"))
    if priority is not None:
        attrs["priority"] = priority
        attrs["level"] = priority
    if isinstance(entry.get("__CURSOR"), str):
        attrs["event_id"] = "journal:" + entry["__CURSOR"]
    event = Event(
        body=journal_message(entry.get("MESSAGE")) or "",
        ts_ns=realtime_us * 1000 if realtime_us is not None else None,
        host=host,
        source="kmsg" if kernel else "journal",
        kind="line",
        pid=_digits(entry.get("_PID")),
        attrs=attrs,
    )
    return attribute_kernel_line(event) if kernel else event


def journalctl_command(
    journalctl: str,
    *,
    file: str | None = None,
    directory: str | None = None,
    cursor: str | None = None,
    start: str = "end",
    units: tuple[str, ...] = (),
    identifiers: tuple[str, ...] = (),
) -> list[str]:
    """The journalctl command line: follow, JSON with every field in full (`--all`: without
    it fields over 4 KiB come out as null), from the cursor or from `start`."""
    command = [journalctl, "-o", "json", "--follow", "--all", "--no-pager", "--quiet"]
    if file:
        command.append(f"--file={file}")
    elif directory:
        command.append(f"--directory={directory}")
    if cursor:
        command += [f"--after-cursor={cursor}", "--no-tail"]
    elif start == "beginning":
        command.append("--no-tail")
    else:
        command += ["--lines=0"]
    # one field's values are ORed; `+` ORs the unit group with the identifier group
    matches = [f"_SYSTEMD_UNIT={unit}" for unit in units]
    if matches and identifiers:
        matches.append("+")
    matches += [f"SYSLOG_IDENTIFIER={name}" for name in identifiers]
    return command + matches


def _holds_journal_files(folder: Path) -> bool:
    """Whether journald has written there (an empty /var/log/journal is common: the systemd
    package creates it on hosts where journald never runs)."""
    for pattern in ("*.journal", "*/*.journal", "*.journal~", "*/*.journal~"):
        try:
            if next(folder.glob(pattern), None) is not None:
                return True
        except OSError:
            return False
    return False


def _nonblocking(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)


class JournalCollector(HostCollector):
    name = "journal"
    stability = "experimental"
    default_interval_s = 5.0  # a safety net: journalctl's output wakes a poll at once
    default_budget_s = 0.5
    metrics_help: ClassVar[Mapping[str, str]] = {
        "journal_entries_total": "Journal entries read from journalctl.",
        "journal_restarts_total": "Times the journalctl process exited and was restarted.",
        "journal_truncated_bytes_total": "Bytes cut from journal entries longer than 1 MiB.",
    }

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        state_dir = self.options.get("state_dir")
        self.state_path = Path(state_dir, STATE_FILE) if state_dir else None
        self.source_key = self._source_key()
        self.cursor: str | None = self._load_cursor()  # the last entry read
        self._saved_cursor = self.cursor  # the last entry committed (on disk)
        self._state_lock = threading.Lock()  # commit() may come from another thread
        self.proc: subprocess.Popen[bytes] | None = None
        self.truncated_before = 0  # bytes cut by rings of earlier journalctl runs
        self.ring = self._new_ring()
        self.backlog: list[bytes] = []  # complete entries beyond one poll's cap
        self.stderr_tail = b""
        self.next_start = 0.0
        self.exits = 0
        self.entries_total = 0

    # -- configuration ---------------------------------------------------------------------
    def _journalctl(self) -> str | None:
        return shutil.which(str(self.options.get("journalctl") or "journalctl"))

    def _source_key(self) -> str:
        if self.options.get("file"):
            return f"file:{self.options['file']}"
        if self.options.get("directory"):
            return f"directory:{self.options['directory']}"
        return "system"

    def _list(self, key: str) -> tuple[str, ...]:
        value = self.options.get(key) or ()
        return (value,) if isinstance(value, str) else tuple(str(v) for v in value)

    def available(self) -> tuple[bool, str]:
        journalctl = self._journalctl()
        if journalctl is None:
            return False, "journalctl not found on PATH: install systemd (Debian: systemd)"
        file, directory = self.options.get("file"), self.options.get("directory")
        if file:
            if not Path(file).is_file():
                return False, f"journal file {file} does not exist"
            return True, f"follows the journal file {file}"
        if directory:
            if not Path(directory).is_dir():
                return False, f"journal directory {directory} does not exist"
            return True, f"follows the journal files in {directory}"
        places = [str(p) for p in self.options.get("system_directories") or ()]
        if not any(_holds_journal_files(Path(place)) for place in places):
            return False, (
                f"no journal at {' or '.join(places)} and no journal file configured "
                "(is journald running? set `file` or `directory` to read a copied journal)"
            )
        return True, "follows the system journal"

    # -- persisted cursor ------------------------------------------------------------------
    def _load_cursor(self) -> str | None:
        text = read_text(self.state_path) if self.state_path else None
        try:
            state = json.loads(text) if text else {}
        except ValueError:
            return None
        if not isinstance(state, dict) or state.get("source") != self.source_key:
            return None  # a cursor of another journal would not seek
        cursor = state.get("cursor")
        return cursor if isinstance(cursor, str) and cursor else None

    def checkpoint(self) -> tuple[str, str | None] | None:
        """(source, cursor of the last entry read): what commit() saves once it is safe."""
        if self.state_path is None or self.cursor == self._saved_cursor:
            return None
        return (self.source_key, self.cursor)

    def commit(self, checkpoint: object) -> None:
        assert isinstance(checkpoint, tuple)
        source: str = checkpoint[0]
        cursor: str | None = checkpoint[1]
        if self.state_path is None or source != self.source_key:
            return
        with self._state_lock:
            if cursor == self._saved_cursor:
                return
            tmp = self.state_path.with_suffix(".tmp")
            try:
                self.state_path.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps({"source": source, "cursor": cursor}))
                os.replace(tmp, self.state_path)
            except OSError:
                return  # an unwritable state dir costs resumption, not collection
            self._saved_cursor = cursor

    # -- the journalctl process ------------------------------------------------------------
    def _start(self) -> bool:
        journalctl = self._journalctl()
        if journalctl is None:
            return False
        command = journalctl_command(
            journalctl,
            file=self.options.get("file"),
            directory=self.options.get("directory"),
            cursor=self.cursor,
            start=str(self.options.get("start", "end")),
            units=self._list("units"),
            identifiers=self._list("identifiers"),
        )
        try:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, "SYSTEMD_PAGER": "", "LC_ALL": "C.UTF-8"},
                start_new_session=True,  # a Ctrl-C to the node agent must not reach it first
            )
        except OSError as exc:
            self.stderr_tail = str(exc).encode()
            return False
        assert self.proc.stdout is not None and self.proc.stderr is not None
        _nonblocking(self.proc.stdout.fileno())
        _nonblocking(self.proc.stderr.fileno())
        self.wake_when_readable(self.proc.stdout.fileno())
        self.truncated_before += self.ring.truncated_bytes
        self.ring, self.backlog, self.stderr_tail = self._new_ring(), [], b""
        return True

    def _new_ring(self) -> Any:
        """journalctl's output framed into entries by the shared ingest ring: twice one poll's
        read, so nothing is ever dropped (the pipe holds journalctl back); an entry longer
        than ENTRY_CAP is cut, counted, and then fails to parse."""
        max_bytes = int(self.options.get("max_bytes_per_poll", 8 << 20))
        return native.load("ringbuf").RingBuffer(2 * max_bytes, ENTRY_CAP)

    def _read(self, fd: int, max_bytes: int) -> tuple[bytes, bool]:
        """What the pipe holds now, up to max_bytes; True when the writer has gone."""
        chunks: list[bytes] = []
        size = 0
        while size < max_bytes:
            try:
                chunk = os.read(fd, READ_CHUNK)
            except BlockingIOError:
                return b"".join(chunks), False
            except OSError:
                return b"".join(chunks), True
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks), False

    def _stop(self) -> int | None:
        self.stop_watching()
        """Terminate journalctl and reap it; its exit status."""
        proc, self.proc = self.proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        return proc.returncode

    # -- one poll --------------------------------------------------------------------------
    def collect(self, ctx: CollectContext) -> list[Observation]:
        out: list[Observation] = []
        if self.proc is None and (time.monotonic() < self.next_start or not self._start()):
            return out  # restarting later: the state event said why
        assert self.proc is not None and self.proc.stdout is not None
        assert self.proc.stderr is not None
        limit = int(self.options.get("max_entries_per_poll", 5000))
        max_bytes = int(self.options.get("max_bytes_per_poll", 8 << 20))
        gone = False
        if len(self.backlog) < limit:
            data, gone = self._read(self.proc.stdout.fileno(), max_bytes)
            self.ring.write(data)
            self.backlog.extend(self.ring.read_lines())  # an incomplete entry waits for the rest
        err, _ = self._read(self.proc.stderr.fileno(), 65536)
        self.stderr_tail = (self.stderr_tail + err)[-STDERR_KEPT:]
        lines, self.backlog = self.backlog[:limit], self.backlog[limit:]
        for line in lines:
            entry = parse_entry(line)
            if entry is None:
                continue
            if isinstance(entry.get("__CURSOR"), str):
                self.cursor = entry["__CURSOR"]
            if entry.get("_TRANSPORT") == "kernel" and self.options.get("skip_kernel"):
                continue
            event = entry_event(entry, ctx.host)
            event.ts_ns = event.ts_ns or ctx.now_ns
            out.append(event)
            self.entries_total += 1
        if gone and self.proc.poll() is None:
            gone = False
        if gone and not self.backlog:
            out.append(self._exited(ctx))
        for name, value in (
            ("journal_entries_total", self.entries_total),
            ("journal_restarts_total", self.exits),
            ("journal_truncated_bytes_total", self.truncated_before + self.ring.truncated_bytes),
        ):
            out.append(
                metric(name, value, source="journal", counter=True, host=ctx.host, ts_ns=ctx.now_ns)
            )
        if self.backlog and self._wake is not None:
            self._wake()  # more than one poll's worth: the next poll comes now
        else:
            self.drained()
        return out

    def _exited(self, ctx: CollectContext) -> Event:
        status = self._stop()
        self.exits += 1
        reason = self.stderr_tail.decode("utf-8", "replace").strip() or "no message"
        if self.cursor and "cursor" in reason.lower():
            self.cursor = None  # a cursor journalctl cannot seek to: start over per `start`
        backoff = float(self.options.get("restart_backoff_s", 5.0))
        self.next_start = time.monotonic() + backoff
        return Event(
            body=f"journalctl exited with status {status}: {reason}; restarting in {backoff:g} s",
            ts_ns=ctx.now_ns,
            host=ctx.host,
            source="journal",
            kind="state",
            attrs={"exit_status": status if status is not None else -1, "restarts": self.exits},
        )

    def close(self) -> None:
        self._stop()
