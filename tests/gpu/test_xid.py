"""The Xid table (data), site overrides, and the per-(GPU, Xid) dedup that never loses a count."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from denpex.core.diagnosis import ACTIONS
from denpex.core.taxonomy import load_taxonomy
from denpex.gpu.nvml.xid import (
    XidTableError,
    XidTracker,
    default_table,
    merge_overrides,
    parse_table,
)

S = 1_000_000_000
EXPECTED = {
    79: "gpu.fallen_off_bus",
    48: "gpu.ecc_uncorrectable",
    94: "gpu.ecc_uncorrectable",
    95: "gpu.ecc_uncorrectable",
    63: "gpu.row_remap",
    64: "gpu.row_remap",
    74: "gpu.nvlink",
    119: "gpu.gsp_timeout",
    120: "gpu.gsp_timeout",
    13: "gpu.mmu_fault",
    31: "gpu.mmu_fault",
    43: "gpu.mmu_fault",
    45: "gpu.mmu_fault",
    92: "gpu.reset_required",
    154: "gpu.reset_required",
}
WELL_KNOWN = (
    13,
    31,
    32,
    43,
    45,
    48,
    61,
    62,
    63,
    64,
    68,
    69,
    74,
    79,
    92,
    94,
    95,
    109,
    119,
    120,
    140,
    143,
    154,
)


def test_table_covers_the_well_known_codes_with_valid_categories() -> None:
    table = default_table()
    taxonomy = load_taxonomy()
    assert set(WELL_KNOWN) <= set(table.codes)
    for code, rule in table.codes.items():
        assert rule.category in taxonomy, code
        assert rule.action in ACTIONS, code
    for code, category in EXPECTED.items():
        assert table.rule(code).category == category
    assert table.rule(43).severity in ("info", "warning")  # application faults: low severity
    assert table.rule(45).severity in ("info", "warning")
    assert table.rule(79).severity == "critical"
    assert table.rule(99999) == table.default


def test_overrides_merge_per_field_and_accept_string_keys() -> None:
    table = merge_overrides(
        default_table(), {"79": {"severity": "error"}, 13: {"count": 5}, 500: {"count": 2}}
    )
    assert table.rule(79).severity == "error"
    assert table.rule(79).category == "gpu.fallen_off_bus"  # untouched fields stay
    assert table.rule(13).count == 5
    assert table.rule(500).count == 2 and table.rule(500).category == table.default.category
    assert table.rule(500).detector == "gpu.mmu_fault.nvml_xid_unlisted"
    assert default_table().rule(79).severity == "critical"  # pure: the default is unchanged


@pytest.mark.parametrize(
    "overrides, problem",
    [
        ({79: {"category": "gpu.thermal"}}, "the category is the code's detector's"),
        ({79: {"name": "renamed"}}, "unknown field"),
        ({79: {"severity": "loud"}}, "severity"),
        ({79: {"action": "panic"}}, "action"),
        ({79: {"count": 0}}, "count"),
        ({79: {"colour": "red"}}, "unknown field"),
        ({"x79": {}}, "an Xid number"),
    ],
)
def test_bad_overrides_are_refused_with_the_key(overrides, problem) -> None:
    with pytest.raises(XidTableError, match=problem):
        merge_overrides(default_table(), overrides)


def test_table_without_default_fields_is_refused() -> None:
    with pytest.raises(XidTableError, match=r"default\.detector: required"):
        parse_table({"default": {"count": 1, "window_s": 60}, "codes": {}})


def test_table_refuses_a_detector_missing_from_the_catalog() -> None:
    default = {"detector": "gpu.mmu_fault.nvml_xid_unlisted", "count": 1, "window_s": 60}
    codes = {7: {"detector": "gpu.mmu_fault.nvml_xid7", "count": 1, "window_s": 60}}
    with pytest.raises(XidTableError, match=r"codes\.7\.detector: .*not in denpex/core"):
        parse_table({"default": default, "codes": codes})


def test_flood_becomes_one_burst_with_count_and_times() -> None:
    tracker = XidTracker(default_table())
    for i in range(50):
        tracker.record("1", 13, 100 * S + i * 1000)
    bursts = tracker.due(101 * S)
    assert len(bursts) == 1
    burst = bursts[0]
    assert (burst.gpu, burst.xid, burst.count) == ("1", 13, 50)
    assert (burst.first_ns, burst.last_ns) == (100 * S, 100 * S + 49 * 1000)
    tracker.record("1", 13, 102 * S)  # same window: counted, not reported again
    assert tracker.due(103 * S) == []
    assert tracker.snapshot() == ({("1", 13): 51}, {"1": 13})


def test_new_window_after_the_old_closes_reports_again() -> None:
    tracker = XidTracker(default_table())  # 79: window 60 s
    tracker.record("0", 79, 0)
    assert len(tracker.due(1 * S)) == 1
    tracker.record("0", 79, 61 * S)
    again = tracker.due(62 * S)
    assert [b.count for b in again] == [1]


def test_count_threshold_waits_for_enough_occurrences_inside_the_window() -> None:
    table = merge_overrides(default_table(), {13: {"count": 3, "window_s": 10}})
    tracker = XidTracker(table)
    tracker.record("0", 13, 0)
    tracker.record("0", 13, 1 * S)
    assert tracker.due(2 * S) == []
    tracker.record("0", 13, 12 * S)  # the first window closed: starts over
    assert tracker.due(12 * S) == []
    tracker.record("0", 13, 13 * S)
    tracker.record("0", 13, 14 * S)
    assert [b.count for b in tracker.due(15 * S)] == [3]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("0123"), st.sampled_from((13, 43, 79, 999)), st.integers(0, 500)),
        max_size=80,
    )
)
def test_totals_never_lose_an_occurrence(records) -> None:
    tracker = XidTracker(default_table())
    for gpu, xid, t in records:
        tracker.record(gpu, xid, t * S)
        tracker.due(t * S)
    totals, _ = tracker.snapshot()
    assert sum(totals.values()) == len(records)
    for gpu, xid, _t in records:
        assert totals[(gpu, xid)] == sum(1 for g, x, _ in records if (g, x) == (gpu, xid))
