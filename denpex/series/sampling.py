"""Which lines of a log the series parser reads: every line whose loss (or another number) is
NaN or Inf, found by the native matcher in one pass over a batch (the scanner hands over those
of the catalog's own pass: denpex.core.scan_cues), and a deterministic sample of the other
lines with numbers, found with one search per sampled line, so that the numbers of a long log
cost the scanner a bounded share of its time; and the end of each log (Tail), read
whole once the log ended, since where each series stopped is what a hang is measured from.

Pure over the bytes it is handed: no clock, no I/O; the same log always gives the same lines.
It never looks at a line it does not return (the per-line cost is what it saves).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import denpex._native as native
from denpex.core.scan_cues import NONFINITE_PATTERN
from denpex.series.parse import LITERAL_SEARCH

# Every line with numbers is read until FULL_PARSE_LINES were; then at most one in `gap` bytes
# of the log, the gap starting at MIN_GAP_BYTES and doubling every DOUBLE_EVERY lines read
# up to MAX_GAP_BYTES, each gap drawn between half and one and a half of that (a fixed gap
# would read the same rank of a round-robin log forever). A series of several MB then yields
# some thousands of points per log, spread over every rank: medians, sustained spikes,
# halvings measured from scale ratios and cumulative skipped counts hold on them.
FULL_PARSE_LINES = 500
DOUBLE_EVERY = 100
MIN_GAP_BYTES = 2048
MAX_GAP_BYTES = 64 * 1024
_SEED = 0x5EED  # the sample is a function of the log alone
# this much of the end of each log is kept and read whole when it ends: every series still
# printing there gets its real last step and time (a sample can stop a gap short of them)
TAIL_BYTES = 128 * 1024


@dataclass(slots=True)
class _Position:
    """Where one log's sample stands: bytes of it seen, where the next sampled line may start
    (both counted over the batches handed in), lines read so far."""

    offset: int = 0
    next_at: int = 0
    sampled: int = 0
    rng: random.Random = field(default_factory=lambda: random.Random(_SEED))

    def gap(self) -> int:
        if self.sampled < FULL_PARSE_LINES:
            return 0
        doublings = (self.sampled - FULL_PARSE_LINES) // DOUBLE_EVERY
        base = min(MAX_GAP_BYTES, MIN_GAP_BYTES << min(doublings, 16))
        return int(base * (0.5 + self.rng.random()))


class LineSampler:
    """`lines_to_read(log, joined)` per batch of one log (its lines joined by newlines):
    the indexes of the lines to parse, ascending."""

    def __init__(self) -> None:
        self._positions: dict[str, _Position] = {}
        self._nonfinite = native.shared_matcher([NONFINITE_PATTERN])

    def lines_to_read(
        self,
        log: str,
        joined: bytes,
        line_at: Callable[[int], int] | None = None,
        nonfinite: Iterable[int] | None = None,
    ) -> list[int]:
        """`line_at` (a native batch's: the line holding a byte offset) saves counting the
        newlines before each sampled line, a pass over the batch; `nonfinite`, the lines
        NONFINITE_PATTERN matches (a caller's matcher found them in its own pass), saves
        this one's pass."""
        position = self._positions.setdefault(log, _Position())
        chosen = set(self._sampled(position, joined, line_at))
        if nonfinite is None:
            nonfinite = (index for index, _ in self._nonfinite.scan(joined))
        chosen.update(nonfinite)
        position.offset += len(joined) + 1
        return sorted(chosen)

    def _sampled(
        self, position: _Position, joined: bytes, line_at: Callable[[int], int] | None
    ) -> Iterator[int]:
        """The sampled lines holding a literal, each the first after the previous one's gap."""

        def gap_after_a_line() -> int:
            position.sampled += 1
            return position.gap()

        start = max(0, position.next_at - position.offset)
        resume = yield from literal_lines(joined, start, line_at, gap_after_a_line)
        position.next_at = position.offset + resume  # a gap past the batch runs on into the next


def literal_lines(
    joined: bytes,
    start: int,
    line_at: Callable[[int], int] | None = None,
    gap: Callable[[], int] = lambda: 0,
) -> Generator[int, None, int]:
    """The indexes of the lines of `joined` that hold one of parse.py's literals (only those
    can hold numbers), ascending, from byte `start` on; after each, the search resumes `gap()`
    bytes past its end. Returns where it would resume. One search for all the literals,
    stopping at the first hit (a bytes.find per literal would scan the whole batch for each
    one the log never prints); `line_at` (a native batch's) saves counting newlines."""
    resume = start
    index, counted_to = 0, 0  # the line number of byte `counted_to`
    while (hit := LITERAL_SEARCH.search(joined, resume)) is not None:
        at = hit.start()
        if line_at is not None:
            index = line_at(at)
        else:
            index += joined.count(b"\n", counted_to, at)
            counted_to = at
        yield index
        end = joined.find(b"\n", at)
        resume = (end if end >= 0 else len(joined)) + 1 + gap()
    return resume


Batch = TypeVar("Batch")


class Tail(Generic[Batch]):
    """The last `size` bytes of each log, as the batches that hold them."""

    def __init__(self, size: int = TAIL_BYTES) -> None:
        self.size = size
        self._kept: dict[str, deque[tuple[int, Batch]]] = {}

    def keep(self, log: str, nbytes: int, batch: Batch) -> None:
        kept = self._kept.setdefault(log, deque())
        kept.append((nbytes, batch))
        newer = sum(n for n, _ in kept) - kept[0][0]
        while len(kept) > 1 and newer >= self.size:
            kept.popleft()
            newer -= kept[0][0]

    def batches(self, log: str) -> list[tuple[int, Batch]]:
        """(bytes at its start that lie before the tail's `size`, batch), oldest first."""
        kept = self._kept.get(log, deque())
        before = sum(n for n, _ in kept) - self.size
        found = []
        for nbytes, batch in kept:
            found.append((max(0, before), batch))
            before -= nbytes
        return found
