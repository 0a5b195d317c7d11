"""Builds a FleetView from the compact fleet descriptions of rule_cases.yaml (and the merge
tests): hosts, switches, racks, rails, GPUs, background jobs, jobs, agent events."""

from __future__ import annotations

from typing import Any

from denpex.control.fleet.model import (
    EvidenceRecord,
    FleetView,
    GpuRef,
    HostState,
    JobOutcome,
    Placement,
)

BASE_NS = 1_796_014_569_000_000_000
HOUR_NS = 3600 * 1_000_000_000
GPU_BUSES = ("18", "2a", "3b", "4c", "5d", "9a", "ab", "bc")


def at(hours: float) -> int:
    return BASE_NS + int(hours * HOUR_NS)


def gpu(host: str, index: int, rank: int | None = None) -> GpuRef:
    return GpuRef(
        host=host, pci=f"0000:{GPU_BUSES[index]}:00.0", serial=f"{host}-g{index}", rank=rank
    )


def _topology(
    fleet: dict[str, Any],
) -> tuple[list[str], dict[str, Placement], dict[str, HostState]]:
    count = int(fleet["hosts"])
    per_switch = int(fleet.get("per_switch", 16))
    per_rack = int(fleet.get("per_rack", 32))
    bad = set(fleet.get("driver_bad", ()))
    hosts = [f"h{i:02d}" for i in range(count)]
    topology, states = {}, {}
    for i, host in enumerate(hosts):
        rails = {f"0000:{bus}:00.0": f"rail{g}" for g, bus in enumerate(GPU_BUSES)}
        topology[host] = Placement(
            host=host,
            rack=f"r{i // per_rack}",
            switch=f"sw{i // per_switch}",
            pdu=f"pdu{i // per_rack}",
            pool="p0",
            rails=rails,
        )
        states[host] = HostState(host=host, labels={"driver": "bad" if host in bad else "good"})
    return hosts, topology, states


def _job(spec: dict[str, Any], states: dict[str, HostState]) -> JobOutcome:
    hosts = tuple(spec["hosts"])
    category = spec.get("category")
    failed = category is not None
    root = spec.get("root", hosts[0]) if failed else None
    ranks: dict[int, str] = {}
    gpus = []
    for h_index, host in enumerate(hosts):
        for g in range(8):
            rank = h_index * 8 + g
            ranks[rank] = host
            gpus.append(gpu(host, g, rank))
    rank = spec.get("rank")
    root_gpu = None
    if failed and "gpu" in spec:
        root_gpu = gpu(root, int(spec["gpu"]), hosts.index(root) * 8 + int(spec["gpu"]))
        rank = root_gpu.rank
    if failed and rank is None:
        rank = hosts.index(root) * 8
    end = at(float(spec["end"]))
    start = at(float(spec.get("start", float(spec["end"]) - 1)))
    ident = str(spec["id"])
    report = str(spec.get("report", ident))  # one job's ranks may report apart
    timeline = ()
    if failed:
        timeline = (
            EvidenceRecord(
                id=f"{report}-e1",
                ts_ns=end - 1_000_000_000,
                host=root,
                category=category,
                severity="error",
                source="log",
                signature=f"{category}.case",
                rank=rank,
                tenant="t1",
                body=f"{category} in job {ident}",
            ),
        )
    return JobOutcome(
        tenant="t1",
        job=ident,
        hosts=hosts,
        ended_ns=end,
        status="failed" if failed else "ok",
        category=category or "unknown",
        root_host=root,
        root_rank=rank if failed else None,
        root_gpu=root_gpu,
        confidence=0.85 if failed else 0.0,
        rule="first_failing_rank" if failed else "noise_is_not_failure",
        evidence=(f"{report}-e1",) if failed else (),
        started_ns=start,
        ranks=ranks,
        gpus=tuple(gpus),
        exit_code=1 if failed else 0,
        timeline=timeline,
        name=str(spec.get("name", ident)),
        labels={"driver": states[hosts[0]].labels["driver"]},
    )


def build_view(case: dict[str, Any]) -> tuple[FleetView, int]:
    hosts, topology, states = _topology(case["fleet"])
    now_h = float(case["now"])
    jobs = []
    clean = int((case.get("background") or {}).get("clean_jobs", 0))
    for host in hosts:
        for n in range(clean):  # spread over the week before `now`, all ok
            end = now_h - 1 - n * (160 / max(clean, 1))
            jobs.append(_job({"id": f"bg-{host}-{n}", "hosts": [host], "end": end}, states))
    jobs.extend(_job(spec, states) for spec in case.get("jobs") or [])
    events = []
    for ident, host, hours, category, severity, source, gpu_index in case.get("events") or []:
        ref = gpu(host, gpu_index) if gpu_index is not None else None
        events.append(
            EvidenceRecord(
                id=ident,
                ts_ns=at(hours),
                host=host,
                category=category,
                severity=severity,
                source=source,
                signature=f"{category}.agent_case",
                gpu_pci=ref.pci[:-2] if ref and ref.pci else None,  # as the kernel prints it
                body=f"{category} on {host}",
            )
        )
    for host, spec in (case.get("state") or {}).items():
        passed = spec.get("diagnostics_passed")
        states[host] = HostState(
            host=host,
            diagnostics_passed_ns=at(passed) if passed is not None else None,
            clean_jobs_since=spec.get("clean_jobs_since"),
            labels=states[host].labels,
        )
    return FleetView(jobs=jobs, host_events=events, topology=topology, hosts=states), at(now_h)
