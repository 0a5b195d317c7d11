"""Remediation for the web UI's tests and screenshots: the site topology of the seeded fleet
(three racks, three leaf switches, two pools), a backend that behaves like a scheduler whose
nodes sit in those pools (every operation succeeds and is recorded, except the drain of the
hosts it is told to fail, which reports the scheduler's refusal), two more failed GPU jobs,
and the tenant's policy: Approve for the training pool, AutoRemediate for the batch pool.

With it the leader derives plans in every group the Actions page shows: one waiting for a
named human (gpu-a07, training pool), one done (gpu-a18) and one failed (gpu-a20, batch).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from denpex.control.fleet.model import Placement
from denpex.remediation.backend import NodeState, Operation, StepResult, Target, result
from tests.control.ui.seed import HOSTS, gpu_job
from tests.remediation.test_backend import Recording

TOPOLOGY_YAML = "hosts:\n" + "".join(
    f"  {h}: {{rack: rack-{1 + n // 8}, switch: leaf-{1 + n // 8}, "
    f"pool: {'batch' if n >= 16 else 'train'}}}\n"
    for n, h in enumerate(HOSTS)
)
POLICY: dict[str, Any] = {
    "tier": "approve",
    "pools": {"batch": "autoremediate"},
    "guards": {
        "blast_radius": {"max_nodes": 4, "max_percent": 50, "window_s": 300},
        "unhealthy_stop_percent": 50,
        "lemon": {"incidents": 5, "window_s": 604800},
    },
}
DONE_HOST, FAILED_HOST = "gpu-a18", "gpu-a20"


def topology() -> dict[str, Placement]:
    from denpex.control.fleet.topology import parse_topology

    return parse_topology(TOPOLOGY_YAML)


class SiteBackend(Recording):
    """A scheduler whose nodes sit in the topology's pools; `fail_drain` hosts refuse drain."""

    name = "site"

    def __init__(self, fail_drain: tuple[str, ...] = (FAILED_HOST,)) -> None:
        super().__init__()
        self.placements = topology()
        self.fail_drain = set(fail_drain)

    def pool_of(self, host: str, *, timeout_s: float) -> str | None:
        placement = self.placements.get(host)
        return placement.pool if placement else None

    def pool_hosts(self, pool: str, *, timeout_s: float) -> tuple[str, ...]:
        return tuple(h for h, p in self.placements.items() if p.pool == pool)

    def drain(self, target: Target, *, reason: str, timeout_s: float) -> StepResult:
        if target.host in self.fail_drain:
            self.calls.append(("drain", {"refused": target.host}))
            return result(
                Operation.DRAIN,
                target,
                time.time_ns(),
                ok=False,
                changed=False,
                detail=f"scontrol: error: Invalid node state specified for {target.host}",
                record={},
            )
        return super().drain(target, reason=reason, timeout_s=timeout_s)

    def state(self, target: Target, *, timeout_s: float) -> NodeState:
        return NodeState(target.host, False, True, "denpex: drained", ())


def remediation_jobs() -> list[dict[str, Any]]:
    """Two more failed jobs in the batch pool, each a GPU off the bus on one host."""
    out = []
    for n, host in enumerate((DONE_HOST, FAILED_HOST)):
        report = copy.deepcopy(gpu_job())
        report["id"], report["job"] = f"r-batch-{n}", f"batch-infer-{n}"
        report["hosts"] = [host]
        report["ranks"] = [0]
        diagnosis = report["diagnosis"]
        diagnosis["timeline"] = diagnosis["timeline"][:2]
        diagnosis["contributing"] = []
        for entry in diagnosis["timeline"]:
            entry["host"], entry["rank"] = host, 0
        root = diagnosis["root_cause"]
        root["host"], root["rank"], root["evidence"] = host, 0, ["e1"]
        root["title"] = f"GPU on {host} fell off the bus"
        diagnosis["actions"] = [
            {"action": "drain_node", "target": host, "reason": "GPU lost (Xid 79)"}
        ]
        out.append(report)
    return out
