"""Counter samples → increases and per-second rates for the fabric collectors, with counter
resets, wrap-around and saturation handled.

Pure: no I/O and no clock (every value and time comes from the caller). Never yields a
negative increase or a spike: a counter that goes down is a reset, i.e. a new baseline,
unless it is a narrow wrapping counter (the 32-bit mlx5 queue counters) that plausibly
wrapped around its width. Saturating counters (the IBA PortCounters: 4, 8, 16 or 32 bits)
never wrap: at their maximum they stop, and an unchanged maximum means "blind", not "quiet".
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

FIRST = "first"  # no earlier sample: nothing to compare with
OK = "ok"
WRAP = "wrap"  # a narrow counter passed its maximum and restarted from 0
RESET = "reset"  # the counter went down: driver reload, `perfquery -R`, port reset
SATURATED = "saturated"  # a saturating counter sits at its maximum: the increase is a floor


def saturated(value: int, bits: int) -> bool:
    """Whether a saturating counter `bits` wide has reached its maximum (all ones)."""
    return bits < 64 and value >= (1 << bits) - 1


def counter_increase(
    previous: int, current: int, bits: int = 64, saturates: bool = False
) -> tuple[int | None, str]:
    """(increase, kind) from one sample to the next of a counter `bits` wide.

    A saturating counter at its maximum gives what it rose by with kind "saturated": the true
    increase may be larger, and further ones are invisible until it is reset. Going down is a
    wrap only for a wrapping counter narrower than 64 bits whose previous value fits its width
    and whose wrapped increase is at most half its range (a bigger one is far more likely a
    reset); anything else going down is a reset: (None, "reset"), no rate this time.
    """
    if current >= previous:
        return current - previous, SATURATED if saturates and saturated(current, bits) else OK
    if bits < 64 and not saturates:
        span = 1 << bits
        wrapped = current + span - previous
        if previous < span and 0 < wrapped <= span // 2:
            return wrapped, WRAP
    return None, RESET


@dataclass(frozen=True, slots=True)
class Delta:
    """What one new sample says: the increase since the last (None after a reset or on the
    first sample), its per-second rate, and how it was read (ok, wrap, reset, first)."""

    increase: int | None
    rate_per_second: float | None
    kind: str


def delta(
    previous: tuple[int, int] | None,
    value: int,
    ts_ns: int,
    bits: int = 64,
    saturates: bool = False,
) -> Delta:
    """The Delta from `previous` = (value, ts_ns) to (value, ts_ns); a rate needs time to
    have passed."""
    if previous is None:
        return Delta(None, None, FIRST)
    before, before_ns = previous
    increase, kind = counter_increase(before, value, bits, saturates)
    seconds = (ts_ns - before_ns) / 1e9
    rate = increase / seconds if increase is not None and seconds > 0 else None
    return Delta(increase, rate, kind)


class CounterTracker:
    """The last sample of many counters, keyed by a string ("mlx5_0/1/symbol_error"); its
    snapshot is plain JSON so a collector can persist it between runs."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}

    def update(
        self, key: str, value: int, ts_ns: int, bits: int = 64, saturates: bool = False
    ) -> Delta:
        found = delta(self._last.get(key), value, ts_ns, bits, saturates)
        self._last[key] = (value, ts_ns)
        return found

    def last(self, key: str) -> int | None:
        sample = self._last.get(key)
        return sample[0] if sample else None

    def __len__(self) -> int:
        return len(self._last)

    def snapshot(self) -> dict[str, list[int]]:
        return {key: [value, ts] for key, (value, ts) in self._last.items()}

    def restore(self, data: Mapping[str, Any]) -> None:
        """Load a snapshot; malformed entries are skipped (a damaged file costs one baseline)."""
        for key, sample in data.items():
            if (
                isinstance(sample, list | tuple)
                and len(sample) == 2
                and all(isinstance(x, int) and x >= 0 for x in sample)
            ):
                self._last[str(key)] = (sample[0], sample[1])


class IncreaseWindow:
    """The increases of one counter over the last `window_s` seconds: what threshold
    detectors compare, so a slow rise is seen however the polls fall."""

    def __init__(self) -> None:
        self._items: deque[tuple[int, int]] = deque()

    def add(self, ts_ns: int, increase: int) -> None:
        if increase > 0:
            self._items.append((ts_ns, increase))

    def total(self, now_ns: int, window_s: float) -> int:
        horizon = now_ns - int(window_s * 1e9)
        while self._items and self._items[0][0] <= horizon:
            self._items.popleft()
        return sum(increase for _, increase in self._items)


def level_for(total: int, thresholds: Mapping[str, Any]) -> str | None:
    """The highest severity ("error", "warning") whose threshold `total` reaches, else None."""
    for severity in ("critical", "error", "warning"):
        limit = thresholds.get(severity)
        if limit is not None and total >= int(limit):
            return severity
    return None


def rising(previous: str | None, current: str | None, order: Iterable[str]) -> bool:
    """Whether `current` is a higher level than `previous` in `order` (lowest first); an
    edge trigger, so a detector reports a level once and not on every poll."""
    ranks = {name: rank for rank, name in enumerate(order, start=1)}
    return ranks.get(current or "", 0) > ranks.get(previous or "", 0)
