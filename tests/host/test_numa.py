"""The NUMA collector on a 2-node fixture tree and on this host's single node."""

from __future__ import annotations

import os

import pytest

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.core.wire import Registration
from denpex.host.numa import NumaCollector, allowed_nodes, parse_node_meminfo


def metrics(out: list) -> dict[tuple[str, ...], float]:
    return {
        (
            e.body,
            *(f"{k}={v}" for k, v in sorted(e.attrs.items()) if k not in ("value", "type")),
        ): e.attrs["value"]
        for e in out
        if isinstance(e, Event) and e.kind == "metric"
    }


def test_parse_node_meminfo() -> None:
    text = "Node 1 MemTotal:  100 kB\nNode 1 MemFree:   40 kB\nNode 1 HugePages_Total:     0\n"
    assert parse_node_meminfo(text) == {"MemTotal": 102400, "MemFree": 40960}


def test_allowed_nodes_maps_cpus_to_nodes() -> None:
    owner = {0: 0, 1: 0, 2: 1, 3: 1}
    status = {"Cpus_allowed_list": "1-2", "Mems_allowed_list": "1"}
    assert allowed_nodes(status, owner) == ({0, 1}, {1})
    assert allowed_nodes({}, owner) == (set(), set())


def test_two_nodes_and_job_placement(fixture_roots) -> None:
    roots = fixture_roots("numa_2node")
    collector = NumaCollector(roots)
    assert collector.available()[0]
    job = Registration(pid=300, job="rank-pair", rank=2, tenant="t")
    out = collector.collect(CollectContext(roots=roots, host="n", jobs=[job], now_ns=3))
    got = metrics(out)
    assert got[("numa_memory_total_bytes", "node=0")] == 65536000 * 1024
    assert got[("numa_memory_free_bytes", "node=1")] == 60000000 * 1024
    assert got[("numa_memory_used_bytes", "node=1")] == 5536000 * 1024
    assert got[("numa_hit_pages_total", "node=1")] == 2000000
    assert got[("numa_other_node_pages_total", "node=1")] == 7000
    assert got[("numa_foreign_pages_total", "node=0")] == 500
    counters = [e for e in out if isinstance(e, Event) and e.body.endswith("_total")]
    assert counters and all(e.attrs["type"] == "counter" for e in counters)
    # 300 runs on CPUs 0-3 (node 0), 301 on 4-5 (node 1); memory: 300 node 0, 301 nodes 0-1
    assert got[("numa_job_processes", "allowed=cpu", "job=rank-pair", "node=0")] == 1
    assert got[("numa_job_processes", "allowed=cpu", "job=rank-pair", "node=1")] == 1
    assert got[("numa_job_processes", "allowed=memory", "job=rank-pair", "node=0")] == 2
    assert got[("numa_job_processes", "allowed=memory", "job=rank-pair", "node=1")] == 1
    assert {name for name, *_ in got} <= set(collector.metrics_help)
    states = [e for e in out if isinstance(e, Event) and e.kind == "state"]
    assert len(states) == 1 and states[0].attrs == {"cpu_nodes": "0-1", "memory_nodes": "0-1"}
    assert states[0].job == "rank-pair" and states[0].rank == 2
    assert not [e for e in out if isinstance(e, Evidence)]
    # unchanged placement is not repeated; a change is
    ctx = CollectContext(roots=roots, host="n", jobs=[job])
    assert not [e for e in collector.collect(ctx) if isinstance(e, Event) and e.kind == "state"]
    roots.proc(301, "status").write_text("Name:\tr\nCpus_allowed_list:\t0\nMems_allowed_list:\t0\n")
    states = [e for e in collector.collect(ctx) if isinstance(e, Event) and e.kind == "state"]
    assert [s.attrs for s in states] == [{"cpu_nodes": "0", "memory_nodes": "0"}]


def test_this_host() -> None:
    roots = Roots()
    collector = NumaCollector(roots)
    ok, reason = collector.available()
    if not ok:
        pytest.skip(reason)
    out = collector.collect(
        CollectContext(roots=roots, host="h", jobs=[Registration(pid=os.getpid(), job="me")])
    )
    got = metrics(out)
    assert got[("numa_memory_total_bytes", "node=0")] > 0
    assert got[("numa_job_processes", "allowed=cpu", "job=me", "node=0")] >= 1
