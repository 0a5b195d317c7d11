"""The text of `ethtool -S <netdev>` (mlx5 counter names) as values: the parser, the pause
counters per PFC priority or in global-pause mode, and the per-priority receive discards.
Pure functions of the command's text; never runs ethtool.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# mlx5 names its pause counters rx_prio3_pause / tx_prio3_pause_duration in PFC mode and
# rx_global_pause / tx_global_pause_duration when the port runs link-level (global) pause
_PAUSE = re.compile(r"^(rx|tx)_(?:prio(\d)|(global))_(pause|pause_duration)$")
_PRIO_DISCARDS = re.compile(r"^rx_prio(\d)_discards$")
GLOBAL = "global"  # the `priority` of the global-pause counters


def parse_ethtool_stats(text: str) -> dict[str, int]:
    """`ethtool -S` output (`NIC statistics:` then `     name: value` lines) → {name: value};
    lines without an integer value are skipped."""
    stats: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.strip().rpartition(":")
        value = value.strip()
        if sep and name and value.isdigit():
            stats[name.strip()] = int(value)
    return stats


@dataclass(frozen=True, slots=True)
class PauseCounter:
    direction: str  # rx: the peer paused us; tx: we paused the peer
    priority: str  # "0".."7", or "global" in global-pause mode
    kind: str  # pause | pause_duration


def pause_counters(stats: Mapping[str, int]) -> dict[PauseCounter, int]:
    """The pause counters (`rx_prio3_pause`, `tx_prio3_pause_duration`, `rx_global_pause` …)."""
    found = {}
    for name, value in stats.items():
        match = _PAUSE.match(name)
        if match:
            priority = match[2] if match[2] is not None else GLOBAL
            found[PauseCounter(match[1], priority, match[4])] = value
    return found


def priority_discards(stats: Mapping[str, int]) -> dict[str, int]:
    """Receive discards per priority (`rx_prio3_discards`): priority → count."""
    found = {}
    for name, value in stats.items():
        match = _PRIO_DISCARDS.match(name)
        if match:
            found[match[1]] = value
    return found


def paused_priorities(stats: Mapping[str, int]) -> set[str]:
    """The priorities PFC has ever paused on (a pause counter above 0): lossless ones."""
    return {c.priority for c, v in pause_counters(stats).items() if v > 0 and c.priority != GLOBAL}


def storm_level(
    frames_per_s: float | None, paused_ratio: float | None, thresholds: Mapping[str, Any]
) -> bool:
    """Whether one poll's pausing on a priority is storm-like (either threshold reached)."""
    frames_limit = thresholds.get("storm_pause_frames_per_second")
    ratio_limit = thresholds.get("storm_pause_ratio")
    return bool(
        (frames_limit is not None and frames_per_s is not None and frames_per_s >= frames_limit)
        or (ratio_limit is not None and paused_ratio is not None and paused_ratio >= ratio_limit)
    )
