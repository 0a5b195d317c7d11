"""Disk spool for evidence: append-only CRC-checked segments and a persisted ack cursor, so
evidence survives a down endpoint and an agent restart and is delivered at least once.

It must never crash on a torn or corrupt file (it skips and counts), never grow past its
bounds (it drops the oldest and counts), and never write a segment it did not create.

Record layout (little-endian), one after another in `<seq>.seg` files:
    magic b"DX" | version u8 (1) | flags u8 (0) | payload length u32 | append time ns u64 |
    CRC32 u32 of the 16 header bytes before it followed by the payload | payload (orjson)
The CRC covers the length, so a flipped length byte cannot send the reader astray; after a
bad record the reader resynchronises on the next header whose CRC checks (JSON payloads
never contain the byte 0x01, so a payload cannot imitate a header).

A failed append (ENOSPC, EIO, a short write followed by an error) leaves every segment
exactly as it was before the call (the file truncated back to its last good offset, the index
untouched) and raises SpoolWriteError: nothing of it is acknowledged, and what is appended once
space returns lands at the offsets the index expects. read() checks each record's CRC again
instead of trusting the index; a record that fails is skipped and counted, never delivered.

Durability (`fsync` policy); `append()` returning means the records are written:
- every policy survives a process crash (kill -9): the data is in the page cache after
  write(), and a torn record from a crash mid-write is skipped on the next open;
- "always": fsync of the segment after every append() (and of the cursor after every ack):
  also survives power loss;
- "batch" (default): fsync when `fsync_interval_s` has passed since the last one, on segment
  roll and on close: power loss loses at most the appends since the last fsync;
- "never": the kernel decides; power loss can lose anything not yet written back.
A cursor lost to power loss only moves delivery back (duplicates, never loss).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import threading
import time
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from denpex.core import jsonio

HEADER = struct.Struct("<2sBBIQI")
MAGIC = b"DX"
VERSION = 1
_HEAD_PROBE = MAGIC + bytes((VERSION, 0))
MAX_RECORD_BYTES = 64 * 1024 * 1024
FSYNC_POLICIES = ("always", "batch", "never")
DROP_REASONS = ("size", "age", "corrupt")
Cursor = tuple[int, int]  # (segment sequence number, byte offset after the last record read)


class SpoolLockedError(RuntimeError):
    """Another process (or another Spool in this one) owns the spool directory."""


class SpoolWriteError(OSError):
    """An append that could not be written (the disk is full, an I/O error): nothing of it
    was kept, the spool is as it was before the call; `errno` is the OS error's."""

    def __init__(self, directory: Path, exc: OSError) -> None:
        super().__init__(
            exc.errno,
            f"spool {directory}: cannot write ({exc.strerror or exc}); nothing of this batch "
            "was kept",
        )

    def __str__(self) -> str:
        return str(self.strerror)


@dataclass(slots=True)
class _Segment:
    seq: int
    path: Path
    size: int = 0
    offsets: array = field(default_factory=lambda: array("q"))  # start of each valid record
    ends: array = field(default_factory=lambda: array("q"))  # end of each valid record
    times: array = field(default_factory=lambda: array("q"))  # append time of each record


def encode_record(payload: bytes, ts_ns: int) -> bytes:
    """One record: header + payload."""
    head = HEADER.pack(MAGIC, VERSION, 0, len(payload), ts_ns, 0)[:16]
    crc = zlib.crc32(payload, zlib.crc32(head))
    return head + struct.pack("<I", crc) + payload


def scan_records(data: bytes) -> list[tuple[int, int, int]]:
    """Valid records in `data` as (start, end, ts_ns), resynchronising after bad bytes.
    Pure: never raises on bad bytes; corrupt_regions() names what it skipped."""
    found: list[tuple[int, int, int]] = []
    pos, size = 0, len(data)
    while pos < size:
        end = _valid_record_end(data, pos)
        if end < 0:
            nxt = data.find(_HEAD_PROBE, pos + 1)
            pos = size if nxt < 0 else nxt
            continue
        found.append((pos, end, HEADER.unpack_from(data, pos)[4]))
        pos = end
    return found


def _valid_record_end(data: bytes, pos: int) -> int:
    if pos + HEADER.size > len(data):
        return -1
    magic, version, _flags, length, _ts, crc = HEADER.unpack_from(data, pos)
    if magic != MAGIC or version != VERSION or length > MAX_RECORD_BYTES:
        return -1
    end = pos + HEADER.size + length
    if end > len(data):
        return -1
    body = memoryview(data)[pos + HEADER.size : end]
    if zlib.crc32(body, zlib.crc32(memoryview(data)[pos : pos + 16])) != crc:
        return -1
    return end


class Spool:
    """A directory of segments; one writer thread and one reader thread may use it at once."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        max_bytes: int = 256 * 1024 * 1024,
        max_age_s: float = 7 * 24 * 3600,
        segment_bytes: int = 8 * 1024 * 1024,
        fsync: str = "batch",
        fsync_interval_s: float = 1.0,
    ) -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {', '.join(FSYNC_POLICIES)}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        # A segment above half the bound would leave the size bound nothing to drop but it.
        self.segment_bytes = max(1, min(segment_bytes, max_bytes // 2))
        self.fsync = fsync
        self.fsync_interval_s = fsync_interval_s
        self._lock = threading.Lock()
        self._lock_fd = self._take_directory_lock()
        self._segments: list[_Segment] = []
        self._write_fd = -1
        self._last_fsync = time.monotonic()
        self._appended = self._acked = 0
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._corrupt_bytes = 0
        self._write_errors = self._cursor_errors = 0
        self._last_error = ""  # why the last append failed; "" once one succeeds again
        self._bad_seen: set[tuple[int, int]] = set()  # (seq, offset) of records failing CRC
        self._cursor: Cursor = self._load_cursor()
        self._load_segments()
        self._delete_acked_segments()

    # --- opening -------------------------------------------------------------------------

    def _take_directory_lock(self) -> int:
        fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise SpoolLockedError(
                f"spool directory {self.directory} is in use by process {owner}; "
                "stop that agent or give this one another --spool-dir"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        return fd

    def _load_cursor(self) -> Cursor:
        try:
            data = jsonio.loads((self.directory / "cursor.json").read_bytes())
            return int(data["segment"]), int(data["offset"])
        except (OSError, ValueError, KeyError, TypeError):
            return (0, 0)  # no cursor or an unreadable one: re-deliver (duplicates, not loss)

    def _load_segments(self) -> None:
        for path in sorted(self.directory.glob("*.seg")):
            if not path.stem.isdigit():
                continue
            seg = _Segment(int(path.stem), path)
            data = path.read_bytes()
            seg.size = len(data)
            records = scan_records(data)
            pending_from = self._cursor[1] if seg.seq == self._cursor[0] else 0
            if seg.seq >= self._cursor[0]:
                # Each unreadable stretch after the cursor lost at least one record.
                bad = [r for r in corrupt_regions(records, len(data)) if r[1] > pending_from]
                self._dropped["corrupt"] += len(bad)
                self._corrupt_bytes += sum(e - max(s, pending_from) for s, e in bad)
            for start, end, ts in records:
                seg.offsets.append(start)
                seg.ends.append(end)
                seg.times.append(ts)
            self._segments.append(seg)
        # The cursor may name a segment that was deleted: start at the next one that exists.
        if self._segments and self._cursor[0] < self._segments[0].seq:
            self._cursor = (self._segments[0].seq, 0)

    # --- writing -------------------------------------------------------------------------

    def append(self, records: list[dict[str, Any]]) -> None:
        """Write `records` (JSON-able dicts) as one batch; on return they are acknowledged
        in the sense of the fsync policy (module docstring). Raises SpoolWriteError when
        they cannot be written, leaving every segment as it was (all or nothing)."""
        if not records:
            return
        now = time.time_ns()
        blobs = [encode_record(jsonio.dumps(r), now) for r in records]
        with self._lock:
            mark = self._mark()
            try:
                written = self._append_locked(blobs, now)
            except OSError as exc:
                self._undo(mark)
                self._write_errors += 1
                self._last_error = f"{exc.strerror or exc}"
                raise SpoolWriteError(self.directory, exc) from exc
            self._appended += written
            self._last_error = ""

    def _append_locked(self, blobs: list[bytes], now: int) -> int:
        batch: list[bytes] = []  # records bound for the live segment, written in one go
        queued = written = 0
        total = self._total_bytes()
        live = self._live()
        for blob in blobs:
            if len(blob) > self.max_bytes:
                self._dropped["size"] += 1
                continue
            end = (live.size if live else 0) + queued + len(blob)
            fits = (
                live is not None
                and (live.size + queued == 0 or end <= self.segment_bytes)
                and total + queued + len(blob) <= self.max_bytes
            )
            if not fits:
                written += self._commit(batch, now)
                batch, queued = [], 0
                self._make_room(len(blob))
                live = self._writable_segment(len(blob))
                total = self._total_bytes()
            batch.append(blob)
            queued += len(blob)
        written += self._commit(batch, now)
        self._maybe_fsync(force=self.fsync == "always")
        return written

    def _mark(self) -> tuple[int, int, int, int]:
        """Where the live segment ends before an append: (its seq or -1, its size, its record
        count, the highest seq in use): what _undo() restores."""
        live = self._live()
        newest = self._segments[-1].seq if self._segments else -1
        if live is None:
            return (-1, 0, 0, newest)
        return (live.seq, live.size, len(live.offsets), newest)

    def _undo(self, mark: tuple[int, int, int, int]) -> None:
        """Put the segments back as _mark() found them: segments this append created are
        deleted, the one it extended is cut back to its last good offset."""
        live_seq, size, count, newest = mark
        while self._segments and self._segments[-1].seq > newest:
            created = self._segments.pop()
            if self._write_fd >= 0:
                os.close(self._write_fd)
                self._write_fd = -1
            created.path.unlink(missing_ok=True)
        if not self._segments or self._segments[-1].seq != live_seq:
            return
        seg = self._segments[-1]
        del seg.offsets[count:], seg.ends[count:], seg.times[count:]
        seg.size = size
        try:
            if self._write_fd >= 0:
                os.ftruncate(self._write_fd, size)
            else:
                os.truncate(seg.path, size)
        except OSError:
            # cannot cut it back: never append to it again; its tail is a torn record that
            # the next open skips, and the index already ends at the last good one
            if self._write_fd >= 0:
                os.close(self._write_fd)
                self._write_fd = -1

    def _commit(self, batch: list[bytes], ts_ns: int) -> int:
        """Write `batch` to the live segment, then index it; an OSError (even after a short
        write) indexes nothing, and append() cuts the segment back."""
        if not batch:
            return 0
        seg = self._segments[-1]
        _write_all(self._write_fd, b"".join(batch))
        for blob in batch:
            seg.offsets.append(seg.size)
            seg.times.append(ts_ns)
            seg.size += len(blob)
            seg.ends.append(seg.size)
        return len(batch)

    def _writable_segment(self, need: int) -> _Segment:
        seg = self._segments[-1] if self._write_fd >= 0 else None
        if seg is None or (seg.size and seg.size + need > self.segment_bytes):
            self._roll()
        return self._segments[-1]

    def _roll(self) -> None:
        if self._write_fd >= 0:
            self._maybe_fsync(force=self.fsync != "never")
            os.close(self._write_fd)
        # With no segment left, number past the cursor so nothing new looks acknowledged.
        seq = self._segments[-1].seq + 1 if self._segments else self._cursor[0] + 1
        path = self.directory / f"{seq:012d}.seg"
        # O_EXCL: never append to a segment this process did not create (it may end torn).
        self._write_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        self._segments.append(_Segment(seq, path))
        if self.fsync != "never":
            _fsync_directory(self.directory)

    def _maybe_fsync(self, *, force: bool = False) -> None:
        if self._write_fd < 0 or self.fsync == "never":
            return
        now = time.monotonic()
        if force or now - self._last_fsync >= self.fsync_interval_s:
            os.fsync(self._write_fd)
            self._last_fsync = now

    def _make_room(self, need: int) -> None:
        """Drop the oldest segments until `need` more bytes fit in max_bytes."""
        while self._segments and self._total_bytes() + need > self.max_bytes:
            if len(self._segments) == 1 and self._write_fd >= 0:
                self._roll()  # the live segment itself is the oldest: close it, then drop it
            self._drop_segment(self._segments[0], "size")

    def _drop_segment(self, seg: _Segment, reason: str) -> None:
        self._dropped[reason] += self._pending_in(seg)
        self._segments.remove(seg)
        if self._write_fd >= 0 and not self._segments:
            os.close(self._write_fd)
            self._write_fd = -1
        if self._cursor[0] <= seg.seq:
            self._set_cursor((seg.seq + 1, 0))
        seg.path.unlink(missing_ok=True)

    # --- reading and acknowledging ---------------------------------------------------------

    def read(self, max_records: int) -> tuple[Cursor, list[dict[str, Any]]]:
        """Up to `max_records` unacknowledged records from the ack cursor on, and the cursor
        that acknowledges them. Reading does not move anything: unacked records come again."""
        with self._lock:
            self._expire()
            out: list[dict[str, Any]] = []
            cursor = self._cursor
            for seg in self._segments:
                if seg.seq < cursor[0] or len(out) >= max_records:
                    continue
                first = _first_at_or_after(seg, cursor[1] if seg.seq == cursor[0] else 0)
                last = min(len(seg.offsets), first + max_records - len(out))
                if first >= last:
                    continue
                with open(seg.path, "rb") as f:
                    f.seek(seg.offsets[first])
                    data = f.read(seg.ends[last - 1] - seg.offsets[first])
                base = seg.offsets[first]
                for i in range(first, last):
                    start, end = seg.offsets[i] - base, seg.ends[i] - base
                    # the index says where a record is; only its CRC says it is still there
                    if _valid_record_end(data, start) != end:
                        self._count_bad(seg, i)
                        continue
                    try:
                        out.append(jsonio.loads(data[start + HEADER.size : end]))
                    except ValueError:
                        self._count_bad(seg, i)  # CRC-valid but not JSON: not ours
                cursor = (seg.seq, seg.ends[last - 1])
            return cursor, out

    def _count_bad(self, seg: _Segment, index: int) -> None:
        """A record the index names but the file no longer holds intact: skipped, counted
        once however often it is read again before the cursor passes it."""
        key = (seg.seq, seg.offsets[index])
        if key not in self._bad_seen:
            self._bad_seen.add(key)
            self._dropped["corrupt"] += 1
            self._corrupt_bytes += seg.ends[index] - seg.offsets[index]

    def ack(self, cursor: Cursor) -> None:
        """Everything before `cursor` (from read()) is delivered; an older cursor is ignored."""
        target = (int(cursor[0]), int(cursor[1]))
        with self._lock:
            if target <= self._cursor:
                return
            self._acked += self._count_between(self._cursor, target)
            self._set_cursor(target)
            self._bad_seen = {key for key in self._bad_seen if key >= target}
            self._delete_acked_segments()

    def _expire(self) -> None:
        cutoff = time.time_ns() - int(self.max_age_s * 1e9)
        while self._segments:
            seg = self._segments[0]
            if seg.times and seg.times[-1] < cutoff and seg is not self._live():
                self._drop_segment(seg, "age")
                continue
            first = _first_at_or_after(seg, self._cursor[1] if seg.seq == self._cursor[0] else 0)
            stop = first
            while stop < len(seg.times) and seg.times[stop] < cutoff:
                stop += 1
            if stop > first:
                self._dropped["age"] += stop - first
                self._set_cursor((seg.seq, seg.ends[stop - 1]))
            break

    def _live(self) -> _Segment | None:
        return self._segments[-1] if self._write_fd >= 0 and self._segments else None

    def _delete_acked_segments(self) -> None:
        for seg in list(self._segments):
            done = seg.seq < self._cursor[0] or (
                seg.seq == self._cursor[0] and self._cursor[1] >= seg.size
            )
            if not done or seg is self._live():
                break
            self._segments.remove(seg)
            seg.path.unlink(missing_ok=True)

    def _set_cursor(self, cursor: Cursor) -> None:
        """Move the ack cursor; persisting it may fail (a full disk): the cursor still moves
        here and is written with the next one, and a restart meanwhile re-delivers from the
        older one (duplicates, never loss)."""
        self._cursor = cursor
        tmp = self.directory / "cursor.json.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(jsonio.dumps({"segment": cursor[0], "offset": cursor[1]}))
                if self.fsync == "always":
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, self.directory / "cursor.json")
        except OSError:
            self._cursor_errors += 1
            with contextlib.suppress(OSError):
                tmp.unlink()

    # --- counting --------------------------------------------------------------------------

    def _pending_in(self, seg: _Segment) -> int:
        if seg.seq < self._cursor[0]:
            return 0
        start = self._cursor[1] if seg.seq == self._cursor[0] else 0
        return len(seg.offsets) - _first_at_or_after(seg, start)

    def _count_between(self, low: Cursor, high: Cursor) -> int:
        total = 0
        for seg in self._segments:
            if low[0] <= seg.seq <= high[0]:
                start = low[1] if seg.seq == low[0] else 0
                stop = high[1] if seg.seq == high[0] else seg.size
                total += _first_at_or_after(seg, stop) - _first_at_or_after(seg, start)
        return total

    def _total_bytes(self) -> int:
        return sum(seg.size for seg in self._segments)

    def stats(self) -> dict[str, Any]:
        """Counters (since this open) and gauges for the agent's self-metrics."""
        with self._lock:
            return {
                "records_pending": sum(self._pending_in(s) for s in self._segments),
                "bytes": self._total_bytes(),
                "segments": len(self._segments),
                "appended_total": self._appended,
                "acked_total": self._acked,
                "dropped_total": dict(self._dropped),
                "corrupt_total": self._dropped["corrupt"],
                "corrupt_bytes_total": self._corrupt_bytes,
                "write_errors_total": self._write_errors,
                "cursor_errors_total": self._cursor_errors,
                "writable": not self._last_error,
                "last_error": self._last_error or None,
            }

    def close(self) -> None:
        """Flush per policy, release the directory; the Spool is unusable afterwards."""
        with self._lock:
            if self._write_fd >= 0:
                self._maybe_fsync(force=self.fsync != "never")
                os.close(self._write_fd)
                self._write_fd = -1
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # closing the descriptor releases the flock
                self._lock_fd = -1

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _first_at_or_after(seg: _Segment, offset: int) -> int:
    """Index of the first record of `seg` starting at or after byte `offset` (bisect)."""
    lo, hi = 0, len(seg.offsets)
    while lo < hi:
        mid = (lo + hi) // 2
        if seg.offsets[mid] < offset:
            lo = mid + 1
        else:
            hi = mid
    return lo


def corrupt_regions(records: list[tuple[int, int, int]], size: int) -> list[tuple[int, int]]:
    """Byte ranges of a segment of `size` bytes that scan_records() found no record in."""
    gaps: list[tuple[int, int]] = []
    pos = 0
    for start, end, _ts in records:
        if start > pos:
            gaps.append((pos, start))
        pos = end
    if pos < size:
        gaps.append((pos, size))
    return gaps


def _write_all(fd: int, blob: bytes) -> None:
    view = memoryview(blob)
    while view:
        view = view[os.write(fd, view) :]


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
