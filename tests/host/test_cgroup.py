"""The cgroup collector on v1 and v2 fixture trees, and a real OOM kill in a v1 memory cgroup."""

from __future__ import annotations

import subprocess
import sys

import pytest

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.core.wire import Registration
from denpex.host.cgroup import CgroupCollector, CgroupSample, memory_near_limit, pids_near_limit
from tests import memcg

V2_PATH = "/kubepods.slice/kubepods-pod1f2e3d4c_aaaa_bbbb_cccc_000000000001.slice/cri-containerd-abc.scope"


def values(out: list) -> dict[str, float]:
    return {e.body: e.attrs["value"] for e in out if isinstance(e, Event) and e.kind == "metric"}


def evidence(out: list) -> list[Evidence]:
    return [e for e in out if isinstance(e, Evidence)]


def test_v2_metrics_and_detectors(fixture_roots) -> None:
    roots = fixture_roots("cgroup_v2")
    collector = CgroupCollector(roots)
    assert collector.available() == (True, f"cgroup v2 at {roots.cgroup()}")
    job = Registration(pid=5001, job="pod-job", rank=0, tenant="t1")  # cgroup found from pid
    ctx = CollectContext(roots=roots, host="n1", jobs=[job], now_ns=9)
    out = collector.collect(ctx)
    got = values(out)
    assert got["cgroup_memory_usage_bytes"] == 990 * 2**20
    assert got["cgroup_memory_working_set_bytes"] == 980 * 2**20
    assert got["cgroup_memory_limit_bytes"] == 2**30
    assert got["cgroup_memory_peak_bytes"] == 1000 * 2**20
    assert got["cgroup_oom_kills_total"] == 1 and got["cgroup_memory_limit_hits_total"] == 17
    assert got["cgroup_cpu_throttled_periods_total"] == 120
    assert got["cgroup_cpu_throttled_seconds_total"] == 4.5
    assert (got["cgroup_pids"], got["cgroup_pids_limit"]) == (95, 100)
    assert set(got) <= set(collector.metrics_help)
    metric_events = [e for e in out if isinstance(e, Event)]
    assert all(e.attrs["cgroup"] == V2_PATH and e.job == "pod-job" for e in metric_events)
    # first poll: OOM baseline (no kill evidence), near-limit warnings
    sigs = {e.signature: e for e in evidence(out)}
    assert set(sigs) == {"host.oom_killed.memory_near_limit", "host.fd_exhausted.pids_near_limit"}
    assert all(e.severity == "warning" for e in sigs.values())
    assert sigs["host.fd_exhausted.pids_near_limit"].captures["pids_max"] == "100"
    assert evidence(collector.collect(ctx)) == []  # conditions persist: said once

    folder = roots.cgroup(V2_PATH)
    events = folder / "memory.events"
    events.write_text(events.read_text().replace("oom_kill 1", "oom_kill 3"))
    (folder / "pids.current").write_text("10\n")
    kills = evidence(collector.collect(ctx))
    assert [(e.signature, e.category, e.severity, e.action) for e in kills] == [
        ("host.oom_killed.cgroup_oom_kill", "host.oom_killed", "critical", "reduce_memory")
    ]
    assert kills[0].captures["count"] == "2" and kills[0].captures["cgroup"] == V2_PATH
    assert V2_PATH in kills[0].summary
    assert (kills[0].event.job, kills[0].event.rank, kills[0].event.tenant) == ("pod-job", 0, "t1")
    (folder / "pids.current").write_text("99\n")
    assert [e.signature for e in evidence(collector.collect(ctx))] == [
        "host.fd_exhausted.pids_near_limit"
    ]  # re-armed after it fell


def test_v1_layout_with_registered_cgroup(fixture_roots) -> None:
    roots = fixture_roots("cgroup_v1")
    collector = CgroupCollector(roots)
    assert collector.available()[0]
    job = Registration(pid=7001, job="j7", cgroup="/slurm/uid_0/job_7")
    ctx = CollectContext(roots=roots, host="n", jobs=[job])
    got = values(collector.collect(ctx))
    assert got["cgroup_memory_usage_bytes"] == 600 * 2**20
    assert got["cgroup_memory_limit_bytes"] == 2048 * 2**20
    assert got["cgroup_memory_under_oom"] == 0 and got["cgroup_oom_kills_total"] == 2
    assert got["cgroup_cpu_throttled_seconds_total"] == 2.5
    assert got["cgroup_pids"] == 12 and "cgroup_pids_limit" not in got  # "max"
    oom = roots.cgroup("memory", "slurm/uid_0/job_7", "memory.oom_control")
    oom.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    kills = evidence(collector.collect(ctx))
    assert [e.captures["count"] for e in kills] == ["1"]
    # a job whose pid has gone and whose cgroup is unknown: nothing, no error
    gone = CollectContext(roots=roots, host="n", jobs=[Registration(pid=424242)])
    assert collector.collect(gone) == []


def test_near_limit_decisions() -> None:
    s = CgroupSample(usage=96, limit=100, inactive_file=0, pids=9, pids_limit=10)
    assert memory_near_limit(s, 0.95) and pids_near_limit(s, 0.9)
    s.inactive_file = 10  # page cache the kernel reclaims before any OOM kill
    assert not memory_near_limit(s, 0.95)
    assert not memory_near_limit(CgroupSample(usage=100, limit=None), 0.5)
    assert not pids_near_limit(CgroupSample(pids=5, pids_limit=None), 0.1)


@pytest.mark.skipif(memcg.unavailable_reason() is not None, reason=str(memcg.unavailable_reason()))
def test_real_oom_kill_in_a_v1_memory_cgroup() -> None:
    with memcg.memory_cgroup(32 << 20) as (folder, cgroup):
        child = subprocess.Popen([sys.executable, "-c", memcg.HOG], stdin=subprocess.PIPE)
        memcg.enter(folder, child.pid)  # before it allocates: it waits for a line on stdin
        roots = Roots()
        collector = CgroupCollector(roots)
        job = Registration(pid=child.pid, job="oom-test", rank=1, tenant="t", cgroup=cgroup)
        ctx = CollectContext(roots=roots, host="here", jobs=[job])
        assert evidence(collector.collect(ctx)) == []  # baseline
        child.communicate(b"go\n", timeout=30)
        assert child.returncode == -9  # SIGKILL from the OOM killer
        kills = [
            e
            for e in evidence(collector.collect(ctx))
            if e.category == "host.oom_killed" and e.severity == "critical"
        ]
    assert len(kills) == 1
    ev = kills[0]
    assert ev.signature == "host.oom_killed.cgroup_oom_kill" and ev.captures["count"] == "1"
    assert ev.captures["cgroup"] == cgroup and ev.event.attrs["cgroup"] == cgroup
    assert (ev.event.job, ev.event.rank, ev.event.tenant, ev.event.pid) == (
        "oom-test",
        1,
        "t",
        child.pid,
    )
    assert ev.captures["limit_bytes"] == str(32 << 20)
