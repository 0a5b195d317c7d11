"""Reference line splitter: bytes chunks in, complete lines out (pure Python twin).

Lines end at b"\\n", b"\\r" or b"\\r\\n" (progress bars rewrite a line with \\r); empty lines
are skipped; a line longer than `cap` keeps its first `cap` bytes and the rest is counted in
`truncated_bytes`, never buffered.
"""

from __future__ import annotations


class LineSplitter:
    def __init__(self, cap: int = 65536) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1 byte")
        self.cap = cap
        self.truncated_bytes = 0
        self.discarded_bytes = 0
        self._pending = bytearray()
        self._pending_overflow = False

    def _take(self, piece: bytes) -> None:
        room = self.cap - len(self._pending)
        if len(piece) > room:
            self._pending += piece[:room]
            self.truncated_bytes += len(piece) - room
        else:
            self._pending += piece

    def feed(self, data: bytes) -> list[bytes]:
        """The lines completed by `data`, without their terminators."""
        parts = data.replace(b"\r", b"\n").split(b"\n")
        lines: list[bytes] = []
        for piece in parts[:-1]:
            self._take(piece)
            if self._pending:
                lines.append(bytes(self._pending))
                self._pending.clear()
        self._take(parts[-1])
        return lines

    def flush(self) -> list[bytes]:
        """The unterminated last line, if any (at end of input)."""
        if not self._pending:
            return []
        line = bytes(self._pending)
        self._pending.clear()
        return [line]

    def reset(self) -> None:
        """Forget the partial line (input was lost before the next chunk); counted."""
        self.discarded_bytes += len(self._pending)
        self._pending.clear()
