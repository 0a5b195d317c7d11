"""Throughput rules of denpex.series: a drop against a series' own baseline, and members
slower than their peers."""

from __future__ import annotations

import random

from denpex.core.detectors import detector
from denpex.series.throughput import ThroughputDrop, slower_than_peers


def test_warm_up_is_ignored_and_a_sustained_slowdown_is_one_warning():
    seed = 5
    print("seed", seed)
    rng = random.Random(seed)
    drop = ThroughputDrop(subject="rank 3")
    found = []
    for step in range(1, 200):
        seconds = 5.0 if step <= 3 else 0.40 + rng.uniform(-0.02, 0.02)  # compile, then steady
        if 100 <= step < 150:
            seconds = 1.2
        finding = drop.observe(step, seconds)
        if finding:
            found.append(finding)
    assert len(found) == 1
    (slow,) = found
    assert slow.signature == "train.straggler.throughput_drop"
    assert detector(slow.signature).severity == "warning"
    assert slow.captures["step"] == "102"  # 3 of the last 5 are slow: the median is
    assert slow.summary.startswith("rank 3 slowed down by step 102: its step time went from 0.4")
    assert 2.8 < float(slow.captures["slowdown"]) < 3.2


def test_a_throughput_series_drops_when_it_falls():
    drop = ThroughputDrop(measure="throughput", unit="samples/s")
    values = [100.0] * 20 + [40.0] * 10
    found = [f for f in (drop.observe(i, v) for i, v in enumerate(values, 1)) if f]
    assert len(found) == 1
    assert "its throughput went from 100 to 40 samples/s (2.50×" in found[0].summary


def test_a_noisy_steady_series_is_quiet():
    rng = random.Random(9)
    drop = ThroughputDrop()
    assert all(drop.observe(i, 0.3 * rng.uniform(0.8, 1.25)) is None for i in range(1, 2000))


def test_slower_than_peers_compares_each_member_with_the_others():
    slow = slower_than_peers({0: 0.100, 1: 0.109, 2: 0.100, 3: 0.125}, 1.10, 0.001)
    assert [(s.member, s.peers_median) for s in slow] == [(3, 0.100)]
    assert slower_than_peers({0: 0.1}, 1.1, 0.0) == []
    assert slower_than_peers({0: 0.0010, 1: 0.0015}, 1.1, 0.001) == []  # under the noise floor
