"""Reference line batcher: a chunk of output in, its complete lines cleaned and joined out
(pure Python twin of `denpex._native.linebatch`).

Lines end at b"\\n", b"\\r" or b"\\r\\n" and empty ones are skipped, as `linesplit` splits
them (a line longer than `cap` keeps its first `cap` bytes, the rest is counted in
`truncated_bytes`); each line is then cleaned the way the scanner reads it: ANSI escape
sequences removed, then a Markdown quote marker (`> `, `> > `) taken off its start. A
`Batch` holds the cleaned lines joined by b"\\n" (one buffer for the matcher and every
bytes.find) and, per line, how many b"\\n" of the chunk came before it (its line number).
Never parses a prefix or matches a pattern: that is the scanner's work on the few lines that
need it.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator

# CSI (`ESC [ … final`), OSC (`ESC ] … BEL` or `ESC ] … ESC \`), and two-byte escapes
ANSI = re.compile(rb"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# a Markdown quote marker ("> ", "> > ", a bare ">" on an empty quoted line), never the
# prompts ">>> " of a Python shell or "->"
QUOTE = re.compile(rb"^(?:>(?: |$)){1,8}")


def clean(line: bytes) -> bytes:
    """One line as the scanner reads it: without ANSI escapes, then without a quote marker."""
    if b"\x1b" in line:
        line = ANSI.sub(b"", line)
    quoted = QUOTE.match(line)
    return line[quoted.end() :] if quoted else line


class Batch:
    """The lines one chunk completed: a sequence of bytes (cleaned lines) over one buffer."""

    __slots__ = ("_newlines", "_starts", "joined", "newlines")

    def __init__(self, lines: list[bytes], newlines: list[int], total_newlines: int = 0) -> None:
        self.joined = b"\n".join(lines)
        self.newlines = total_newlines  # the b"\n" bytes of the chunk (0 for a flush)
        starts, at = [], 0
        for line in lines:
            starts.append(at)
            at += len(line) + 1
        self._starts = starts
        self._newlines = newlines

    def __len__(self) -> int:
        return len(self._starts)

    def _end(self, index: int) -> int:
        return self._starts[index + 1] - 1 if index + 1 < len(self._starts) else len(self.joined)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(len(self._starts)))]
        count = len(self._starts)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError("line index out of range")
        return self.joined[self._starts[index] : self._end(index)]

    def __iter__(self) -> Iterator[bytes]:
        for index in range(len(self._starts)):
            yield self[index]

    def head(self, count: int) -> bytes:
        """The first `count` lines joined by b"\\n" (without a final one)."""
        if count >= len(self._starts):
            return self.joined
        return self.joined[: self._starts[count] - 1] if count > 0 else b""

    def line_at(self, offset: int) -> int:
        """The index of the line that holds byte `offset` of `joined` (its b"\\n" ending it)."""
        if not 0 <= offset <= len(self.joined) or not self._starts:
            raise IndexError("offset out of range")
        return bisect.bisect_right(self._starts, offset) - 1

    def newlines_before(self, index: int) -> int:
        """How many b"\\n" of the chunk come before the first byte of line `index` (0 for a
        line that began in an earlier chunk)."""
        return self._newlines[index]


class LineBatcher:
    """Per stream: the partial line between chunks, and the bytes cut off long lines."""

    def __init__(self, cap: int = 65536) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1 byte")
        self.cap = cap
        self.truncated_bytes = 0
        self.discarded_bytes = 0
        self._pending = bytearray()

    def _take(self, piece: bytes) -> None:
        room = self.cap - len(self._pending)
        if len(piece) > room:
            self._pending += piece[:room]
            self.truncated_bytes += len(piece) - room
        else:
            self._pending += piece

    def feed(self, data: bytes) -> Batch:
        """The lines completed by `data`."""
        lines: list[bytes] = []
        newlines: list[int] = []
        seen = 0  # b"\n" of this chunk before the current piece
        started = 0  # … before the first byte of the pending line (0: an earlier chunk)
        at = 0
        for piece in data.replace(b"\r", b"\n").split(b"\n")[:-1]:
            if not self._pending and piece:
                started = seen
            self._take(piece)
            if self._pending:
                lines.append(clean(bytes(self._pending)))
                newlines.append(started)
                self._pending.clear()
            at += len(piece)
            if data[at : at + 1] == b"\n":
                seen += 1
            at += 1
        self._take(data[at:])
        return Batch(lines, newlines, seen)

    def flush(self) -> Batch:
        """The unterminated last line, if any (at end of input)."""
        if not self._pending:
            return Batch([], [])
        line = clean(bytes(self._pending))
        self._pending.clear()
        return Batch([line], [0])

    def reset(self) -> None:
        """Forget the partial line (input was lost before the next chunk); counted."""
        self.discarded_bytes += len(self._pending)
        self._pending.clear()
