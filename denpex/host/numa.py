"""NUMA: per-node memory and allocation counters, and where each job's processes may run.

Reads `<sysfs>/devices/system/node/node*/{meminfo,numastat,cpulist}` and the affinity lines
of the jobs' `/proc/<pid>/status`; never changes an affinity and never raises for a missing
node or a vanished process. Affinity is information, not a fault: no detector here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from denpex.core.collector import CollectContext, Observation
from denpex.core.events import Event, metric
from denpex.core.roots import Roots, read_text
from denpex.core.wire import Registration
from denpex.host.base import HostCollector
from denpex.host.procfs import (
    attribute,
    format_id_list,
    parse_colon_fields,
    parse_id_list,
    parse_int_fields,
    parse_kb,
    read_status,
    resolve_job_pids,
)

NUMASTAT_COUNTERS = ("numa_hit", "numa_miss", "numa_foreign", "other_node")

HELP = {
    "numa_memory_total_bytes": "Memory of the NUMA node",
    "numa_memory_free_bytes": "Free memory of the NUMA node",
    "numa_memory_used_bytes": "Used memory of the NUMA node",
    "numa_hit_pages_total": "Pages allocated on this node as intended",
    "numa_miss_pages_total": "Pages allocated on this node though another node was preferred",
    "numa_foreign_pages_total": "Pages meant for this node that were allocated elsewhere",
    "numa_other_node_pages_total": "Pages allocated on this node by a process on another node",
    "numa_job_processes": (
        "Job processes allowed on the node (label allowed=cpu: may run on its CPUs; "
        "allowed=memory: may allocate from it)"
    ),
}


def parse_node_meminfo(text: str) -> dict[str, int]:
    """`Node 0 MemTotal:  5334816 kB` lines → {"MemTotal": bytes, …}."""
    fields = {}
    for key, value in parse_colon_fields(text).items():
        name = key.split()[-1] if key else key
        size = parse_kb(value)
        if size is not None:
            fields[name] = size
    return fields


def node_ids(roots: Roots) -> list[int]:
    try:
        names = os.listdir(roots.sys("devices", "system", "node"))
    except OSError:
        return []
    return sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit())


def cpu_nodes(roots: Roots, nodes: list[int]) -> dict[int, int]:
    """cpu id → node id, from each node's cpulist."""
    owner = {}
    for node in nodes:
        text = read_text(roots.sys("devices", "system", "node", f"node{node}", "cpulist"))
        for cpu in parse_id_list(text or ""):
            owner[cpu] = node
    return owner


def allowed_nodes(status: dict[str, str], cpu_owner: dict[int, int]) -> tuple[set[int], set[int]]:
    """(nodes whose CPUs the process may run on, nodes it may allocate memory from)."""
    cpus = parse_id_list(status.get("Cpus_allowed_list", ""))
    mems = parse_id_list(status.get("Mems_allowed_list", ""))
    return {cpu_owner[c] for c in cpus if c in cpu_owner}, set(mems)


class NumaCollector(HostCollector):
    name = "numa"
    stability = "experimental"
    default_interval_s = 15.0
    default_budget_s = 1.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self._placement: dict[str, tuple[str, str]] = {}  # job → (cpu nodes, memory nodes)

    def available(self) -> tuple[bool, str]:
        nodes = node_ids(self.roots)
        if not nodes:
            return False, (
                f"no NUMA nodes under {self.roots.sys('devices', 'system', 'node')} "
                "(kernel without CONFIG_NUMA)"
            )
        return True, f"{len(nodes)} NUMA node(s) under {self.roots.sys('devices/system/node')}"

    def collect(self, ctx: CollectContext) -> list[Observation]:
        nodes = node_ids(ctx.roots)
        out: list[Observation] = []
        for node in nodes:
            folder = ctx.roots.sys("devices", "system", "node", f"node{node}")
            labels = {"node": str(node)}
            mem = parse_node_meminfo(read_text(folder / "meminfo") or "")
            for key, name in (("MemTotal", "total"), ("MemFree", "free"), ("MemUsed", "used")):
                if key in mem:
                    out.append(
                        metric(
                            f"numa_memory_{name}_bytes",
                            mem[key],
                            source="numa",
                            labels=labels,
                            host=ctx.host,
                            ts_ns=ctx.now_ns,
                        )
                    )
            stat = parse_int_fields(read_text(folder / "numastat") or "")
            for key in NUMASTAT_COUNTERS:
                if key in stat:
                    name = key if key.startswith("numa_") else f"numa_{key}"
                    out.append(
                        metric(
                            f"{name}_pages_total",
                            stat[key],
                            source="numa",
                            counter=True,
                            labels=labels,
                            host=ctx.host,
                            ts_ns=ctx.now_ns,
                        )
                    )
        owner = cpu_nodes(ctx.roots, nodes)
        for job in ctx.jobs:
            out += self._job_placement(ctx, job, nodes, owner)
        return out

    def _job_placement(
        self, ctx: CollectContext, job: Registration, nodes: list[int], owner: dict[int, int]
    ) -> list[Observation]:
        name = job.job or str(job.pid)
        on_cpu = dict.fromkeys(nodes, 0)
        on_mem = dict.fromkeys(nodes, 0)
        for pid in resolve_job_pids(ctx.roots, pid=job.pid):
            status = read_status(ctx.roots, pid)
            if status is None:
                continue
            cpu_set, mem_set = allowed_nodes(status, owner)
            for node in cpu_set & on_cpu.keys():
                on_cpu[node] += 1
            for node in mem_set & on_mem.keys():
                on_mem[node] += 1
        out: list[Observation] = []
        for allowed, counts in (("cpu", on_cpu), ("memory", on_mem)):
            for node, count in counts.items():
                event = metric(
                    "numa_job_processes",
                    count,
                    source="numa",
                    host=ctx.host,
                    ts_ns=ctx.now_ns,
                    pid=job.pid,
                    labels={"job": name, "node": str(node), "allowed": allowed},
                )
                out.append(attribute(event, job))
        placement = (
            format_id_list(n for n, c in on_cpu.items() if c),
            format_id_list(n for n, c in on_mem.items() if c),
        )
        if self._placement.get(name) != placement:
            self._placement[name] = placement
            event = Event(
                body=f"job {name} processes may run on NUMA node(s) {placement[0] or 'none'} "
                f"and allocate memory on node(s) {placement[1] or 'none'}",
                ts_ns=ctx.now_ns,
                host=ctx.host,
                source="numa",
                kind="state",
                pid=job.pid,
                attrs={"cpu_nodes": placement[0], "memory_nodes": placement[1]},
            )
            out.append(attribute(event, job))
        return out
