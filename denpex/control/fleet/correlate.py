"""`correlate`: the fleet rules over one FleetView, in precedence order (DESIGN §6, §9).

Pure: the same view, `now_ns` and config give the same candidates, in the same order.
"""

from __future__ import annotations

from denpex.control.fleet.config import FleetConfig, load_fleet_rules
from denpex.control.fleet.context import FleetContext
from denpex.control.fleet.model import FleetView, IncidentCandidate
from denpex.control.fleet.rules import RULES


def correlate(
    view: FleetView, now_ns: int, config: FleetConfig | None = None
) -> list[IncidentCandidate]:
    """Every incident candidate the fleet rules find in `view` as of `now_ns`.

    Rules run highest first (fleet_wide, shared_component, hardware_in_job,
    repeat_offender, recovered); what a higher rule explains is never blamed again below."""
    ctx = FleetContext(view, now_ns, config or load_fleet_rules())
    found: list[IncidentCandidate] = []
    for rule in RULES:
        found.extend(rule(ctx))
    return found
