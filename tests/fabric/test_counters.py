"""Counter deltas: resets never give a negative rate or a spike, narrow counters wrap,
windows and levels trigger on edges."""

from __future__ import annotations

from hypothesis import given, seed
from hypothesis import strategies as st

from denpex.fabric.counters import (
    FIRST,
    OK,
    RESET,
    SATURATED,
    WRAP,
    CounterTracker,
    IncreaseWindow,
    counter_increase,
    delta,
    level_for,
    rising,
)

S = 1_000_000_000


def test_increase_reset_and_wrap() -> None:
    assert counter_increase(10, 25) == (15, OK)
    assert counter_increase(10, 10) == (0, OK)
    assert counter_increase(2**32 - 100, 50, bits=32) == (150, WRAP)
    # a 64-bit counter that goes down was reset, whatever the values
    assert counter_increase(2**32 - 100, 50, bits=64) == (None, RESET)
    # a 32-bit counter far from its top that goes down: a reset, not a 4-billion wrap
    assert counter_increase(1000, 10, bits=32) == (None, RESET)
    # a value wider than the declared width cannot have wrapped at it
    assert counter_increase(2**40, 5, bits=32) == (None, RESET)


def test_saturating_counters_stop_and_never_wrap() -> None:
    # an IBA PortCounter stops at all ones: what it rose by is only a floor
    assert counter_increase(100, 65535, bits=16, saturates=True) == (65435, SATURATED)
    assert counter_increase(65535, 65535, bits=16, saturates=True) == (0, SATURATED)
    assert counter_increase(14, 15, bits=4, saturates=True) == (1, SATURATED)
    assert counter_increase(200, 254, bits=8, saturates=True) == (54, OK)
    # going down near the top is a wrap for a wrapping counter, a reset for a saturating one
    assert counter_increase(65000, 10, bits=16) == (546, WRAP)
    assert counter_increase(65000, 10, bits=16, saturates=True) == (None, RESET)
    # 64-bit counters never saturate in practice
    assert counter_increase(5, 2**64 - 1, bits=64, saturates=True) == (2**64 - 6, OK)


def test_delta_rates() -> None:
    assert delta(None, 5, 0).kind == FIRST
    found = delta((100, 0), 600, 5 * S)
    assert (found.increase, found.rate_per_second, found.kind) == (500, 100.0, OK)
    reset = delta((10_000, 0), 3, 5 * S)
    assert (reset.increase, reset.rate_per_second, reset.kind) == (None, None, RESET)
    assert delta((1, 5 * S), 2, 5 * S).rate_per_second is None  # no time passed


@seed(20261130)
@given(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=0, max_value=2**64 - 1),
    st.sampled_from([8, 16, 32, 64]),
)
def test_never_negative(previous: int, current: int, bits: int) -> None:
    increase, kind = counter_increase(previous, current, bits)
    assert increase is None or increase >= 0
    assert (increase is None) == (kind == RESET)
    if increase is not None and bits < 64 and kind == WRAP:
        assert increase <= 2 ** (bits - 1)  # no spike bigger than half the range


@seed(20261130)
@given(st.integers(min_value=0, max_value=2**32 - 1), st.integers(min_value=1, max_value=2**31))
def test_32bit_wrap_recovers_the_true_increase(start: int, step: int) -> None:
    after = (start + step) % 2**32
    assert counter_increase(start, after, bits=32)[0] == step


def test_tracker_snapshot_round_trip() -> None:
    tracker = CounterTracker()
    assert tracker.update("mlx5_0/1/symbol_error", 3, 0).kind == FIRST
    copy = CounterTracker()
    copy.restore({**tracker.snapshot(), "bad": ["x", 1], "short": [1]})
    assert len(copy) == 1 and copy.last("mlx5_0/1/symbol_error") == 3
    assert copy.update("mlx5_0/1/symbol_error", 7, 2 * S).rate_per_second == 2.0


def test_window_and_levels() -> None:
    window = IncreaseWindow()
    for i in range(6):
        window.add(i * 60 * S, 1)
    assert window.total(5 * 60 * S, 600) == 6
    assert window.total(12 * 60 * S, 600) == 3  # the first three fell out of the window
    rule = {"warning": 5, "error": 500}
    assert level_for(4, rule) is None
    assert level_for(5, rule) == "warning" and level_for(900, rule) == "error"
    order = ("warning", "error", "critical")
    assert rising(None, "warning", order) and rising("warning", "error", order)
    assert not rising("warning", "warning", order) and not rising("error", "warning", order)
