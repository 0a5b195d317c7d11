"""What `denpex scan` reads and how much of it: files, descriptors, followed files, tails.

Reads in chunks and hands them to a feed function; follows a growing file through
truncation and rotation; notices inputs that are empty or binary; keeps the last 64 KiB of
every line longer than the scanner's cap so that an error at the end of a 10 MB line is
still scanned. Never writes anything but the notes it returns; never waits for a file
except in `follow`, which stops when asked.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

CHUNK = 1 << 20
SNIFF_BYTES = 64 << 10  # how much of an input is looked at to tell text from binary
BINARY_RATIO = 0.3  # this share of control bytes (not tab, newline, CR, escape) is binary
FOLLOW_POLL_S = 0.25
_TEXT_CONTROLS = frozenset(b"\t\n\r\x1b\x08\x0c")
# every byte but the control bytes counted against text: deleting them leaves those (a pass in
# C, where a Python loop over a sniffed chunk cost milliseconds a file)
_NOT_COUNTED = bytes(b for b in range(256) if b >= 0x20 or b in _TEXT_CONTROLS)


def looks_binary(sample: bytes) -> str | None:
    """Why a sample of an input is not text (NUL bytes, mostly control bytes), or None."""
    if not sample:
        return None
    if b"\0" in sample:
        return "it contains NUL bytes"
    controls = len(sample.translate(None, _NOT_COUNTED))
    if controls / len(sample) >= BINARY_RATIO:
        return f"{controls / len(sample):.0%} of its first bytes are control characters"
    return None


class LongLineTails:
    """Finds the lines of a stream longer than `cap` and keeps the last `cap` bytes of each
    (the scanner keeps the first `cap`). Lines end at \\n or \\r, as the scanner splits them."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.length = 0  # bytes of the current, unterminated line so far
        self.tail = bytearray()  # its last `cap` bytes
        self.long_lines = 0
        self.skipped_bytes = 0  # bytes in the middle of long lines that nobody scanned

    def _extend(self, piece: bytes) -> None:
        self.length += len(piece)
        self.tail += piece[-self.cap :]
        del self.tail[: max(0, len(self.tail) - self.cap)]

    def _ended(self, out: list[bytes]) -> None:
        if self.length > self.cap:
            self.long_lines += 1
            self.skipped_bytes += max(0, self.length - 2 * self.cap)
            out.append(bytes(self.tail))
        self.length = 0
        self.tail.clear()

    def feed(self, data: bytes, inner_may_be_long: bool = True) -> list[bytes]:
        """Tails of the long lines that end in `data`. `inner_may_be_long` False (the
        scanner truncated nothing in this chunk) skips looking at the lines inside it."""
        out: list[bytes] = []
        last = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if last < 0:
            self._extend(data)
            return out
        ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
        first = min(ends)
        self._extend(data[:first])
        self._ended(out)
        inner = data[first + 1 : last]
        if inner_may_be_long and len(inner) > self.cap:
            for piece in inner.replace(b"\r", b"\n").split(b"\n"):
                if len(piece) > self.cap:
                    self.length, self.tail = len(piece), bytearray(piece[-self.cap :])
                    self._ended(out)
        self._extend(data[last + 1 :])
        return out

    def flush(self) -> list[bytes]:
        out: list[bytes] = []
        self._ended(out)
        return out


@dataclass(slots=True)
class InputNotes:
    """What was read of each input, for the diagnosis notes."""

    empty: list[str] = field(default_factory=list)
    binary: list[tuple[str, str]] = field(default_factory=list)
    total_bytes: int = 0

    def notes(self, tails: list[LongLineTails], cap: int) -> list[str]:
        out = [f"{name} is empty: nothing was scanned" for name in self.empty]
        out += [
            f"{name} does not look like a log ({why}): its text was scanned, but a binary "
            "file rarely holds the lines that explain a failure"
            for name, why in self.binary
        ]
        long_lines = sum(t.long_lines for t in tails)
        if long_lines:
            skipped = sum(t.skipped_bytes for t in tails)
            out.append(
                f"{long_lines} line(s) longer than {cap // 1024} KiB: the first and the last "
                f"{cap // 1024} KiB of each were scanned"
                + (f", {skipped} byte(s) in between were not" if skipped else "")
            )
        return out

    def counts(self, tails: list[LongLineTails]) -> dict[str, int]:
        return {
            "empty_inputs": len(self.empty),
            "binary_inputs": len(self.binary),
            "long_lines": sum(t.long_lines for t in tails),
            "unscanned_line_bytes": sum(t.skipped_bytes for t in tails),
        }


Feed = Callable[[bytes], None]


def read_all(name: str, handle: BinaryIO | int, feed: Feed, notes: InputNotes) -> int:
    """Feed an open file or a descriptor to its end; the bytes read. Notes an empty or a
    binary input under `name`."""
    total = 0
    while True:
        chunk = os.read(handle, CHUNK) if isinstance(handle, int) else handle.read(CHUNK)
        if not chunk:
            break
        if total == 0:
            why = looks_binary(chunk[:SNIFF_BYTES])
            if why:
                notes.binary.append((name, why))
        total += len(chunk)
        feed(chunk)
    if total == 0:
        notes.empty.append(name)
    notes.total_bytes += total
    return total


def follow(path: str, feed: Feed, stop: Callable[[], bool]) -> None:
    """Read the file to its end, then what is appended until `stop()`. A file truncated in
    place is read again from its start; a rotated one (a new file at the path) is reopened
    once the old one is read to its end."""
    handle = open(path, "rb")  # noqa: SIM115 (reopened on rotation)
    try:
        while not stop():
            chunk = handle.read(CHUNK)
            if chunk:
                feed(chunk)
                continue
            try:
                now = os.stat(path)
            except FileNotFoundError:  # between the rename and the new file
                time.sleep(FOLLOW_POLL_S)
                continue
            if now.st_ino != os.fstat(handle.fileno()).st_ino:
                handle.close()
                handle = open(path, "rb")  # noqa: SIM115
                continue
            if now.st_size < handle.tell():
                handle.seek(0)
            time.sleep(FOLLOW_POLL_S)
    finally:
        handle.close()
