"""Fleet causality: rules above the single job and incident grouping, pure functions over
the plain records of `model` (no I/O, no clock: callers pass `now_ns`).

    candidates = correlate(view, now_ns, config)   # list[IncidentCandidate]
    changes = merge(open_incidents, candidates)    # MergeResult: opened, updated, resolved
"""

from denpex.control.fleet.config import FleetConfig, load_fleet_rules, parse_fleet_rules
from denpex.control.fleet.correlate import correlate
from denpex.control.fleet.merge import merge

__all__ = ["FleetConfig", "correlate", "load_fleet_rules", "merge", "parse_fleet_rules"]
