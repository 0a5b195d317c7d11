"""thresholds.yaml: every key known to a dataclass, every dataclass field in the file, options
override by name, and the SDK accepts exactly these names."""

from __future__ import annotations

import pytest

from denpex.series import thresholds as th


def test_the_shipped_file_loads_every_section():
    loaded = th.defaults()
    assert set(loaded) == set(th.SECTIONS)
    assert th.default(th.LossRules).spike_threshold == 10.0
    assert th.default(th.ProgressRules).readers == 3


def test_unknown_missing_and_bad_values_are_refused():
    good = th.resources.files("denpex.series").joinpath("thresholds.yaml").read_text()
    with pytest.raises(th.ThresholdsError, match="unknown \\['spike_thresold'\\]"):
        th.parse(good.replace("spike_threshold:", "spike_thresold:"))
    with pytest.raises(th.ThresholdsError, match="sections"):
        th.parse("loss: {}\n")
    with pytest.raises(th.ThresholdsError, match="negative"):
        th.parse(good.replace("scale_floor: 1.0", "scale_floor: -1"))
    with pytest.raises(th.ThresholdsError, match="not a number"):
        th.with_options(th.LossRules, {"spike_window": "many"})


def test_options_override_by_name_and_keep_their_types():
    rules = th.with_options(th.LossRules, {"spike_window": 50.0, "every": 10, "hang_floor_s": 1})
    assert rules.spike_window == 50 and isinstance(rules.spike_window, int)
    assert th.with_options(th.LossRules, {"spike_window": None}) == th.default(th.LossRules)


def test_the_sdk_takes_every_threshold_but_the_log_only_ones():
    from denpex.sdk.watch import KNOWN_OPTIONS

    names = th.option_names()
    assert names - KNOWN_OPTIONS == set(th.LOG_ONLY)
    assert "log_hang_floor_s" in names and "spike_threshold" in KNOWN_OPTIONS
