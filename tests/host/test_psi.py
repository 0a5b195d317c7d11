"""The PSI collector on a fixture tree (v2 job cgroup), on this host's /proc, and its parser."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.core.wire import Registration
from denpex.host.psi import PsiCollector, parse_psi

JOB = Registration(pid=4242, job="train-42", rank=3, tenant="team-a")


def metrics(out: list) -> dict[tuple[str, str, str, str], float]:
    return {
        (e.body, e.attrs["resource"], e.attrs["scope"], e.attrs.get("cgroup", "")): e.attrs["value"]
        for e in out
        if isinstance(e, Event) and e.kind == "metric"
    }


def evidence(out: list) -> list[Evidence]:
    return [e for e in out if isinstance(e, Evidence)]


def test_parse_psi_converts_percent_and_microseconds() -> None:
    lines = parse_psi(
        "some avg10=1.50 avg60=0.20 avg300=0.05 total=1234567\n"
        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
    )
    assert lines["some"].avg10 == 0.015 and lines["some"].total_s == 1.234567
    assert lines["full"].avg300 == 0.0
    assert parse_psi("some avg10=x\n") == {}


@given(
    st.lists(st.floats(min_value=0, max_value=100), min_size=3, max_size=3),
    st.integers(min_value=0, max_value=2**63),
)
def test_parse_psi_round_trips_values(avgs: list[float], total: int) -> None:
    text = f"some avg10={avgs[0]:.2f} avg60={avgs[1]:.2f} avg300={avgs[2]:.2f} total={total}"
    line = parse_psi(text)["some"]
    assert 0.0 <= line.avg10 <= 1.0 and abs(line.avg10 - float(f"{avgs[0]:.2f}") / 100) < 1e-12
    assert line.total_s == total / 1e6


def test_host_and_job_pressure_from_fixture(fixture_roots) -> None:
    roots = fixture_roots("psi")
    collector = PsiCollector(roots)
    assert collector.available()[0]
    out = collector.collect(CollectContext(roots=roots, host="node1", jobs=[JOB], now_ns=5))
    values = metrics(out)
    assert values[("psi_some_avg10_ratio", "cpu", "host", "")] == 0.725
    assert values[("psi_full_stall_seconds_total", "memory", "host", "")] == 2.5
    assert values[("psi_full_avg10_ratio", "memory", "cgroup", "/slurm/job_42")] == 0.25
    job_metrics = [e for e in out if isinstance(e, Event) and e.attrs.get("scope") == "cgroup"]
    assert job_metrics and all(
        (e.job, e.rank, e.tenant, e.pid) == ("train-42", 3, "team-a", 4242) for e in job_metrics
    )
    assert all(e.host == "node1" and e.ts_ns == 5 for e in out if isinstance(e, Event))
    assert all(name in collector.metrics_help for name, *_ in values)

    found = {(ev.signature, ev.captures["scope"]): ev for ev in evidence(out)}
    assert set(found) == {
        ("host.oom_killed.memory_pressure", "host"),
        ("host.oom_killed.memory_pressure", "cgroup /slurm/job_42"),
        ("train.straggler.cpu_pressure", "host"),
    }
    job_ev = found[("host.oom_killed.memory_pressure", "cgroup /slurm/job_42")]
    assert job_ev.severity == "warning" and job_ev.category == "host.oom_killed"
    assert job_ev.event.job == "train-42" and job_ev.event.attrs["cgroup"] == "/slurm/job_42"
    assert job_ev.captures["avg10"] == "0.2500"
    cpu_ev = found[("train.straggler.cpu_pressure", "host")]
    assert cpu_ev.category == "train.straggler" and cpu_ev.severity == "warning"


def test_warns_once_then_rearms_when_pressure_falls(fixture_roots) -> None:
    roots = fixture_roots("psi")
    collector = PsiCollector(roots, {"cpu_some_avg10": 2.0})  # cpu detector off
    ctx = CollectContext(roots=roots, host="n", jobs=[])
    assert len(evidence(collector.collect(ctx))) == 1
    assert evidence(collector.collect(ctx)) == []  # still high: not repeated
    memory = roots.proc("pressure", "memory")
    memory.write_text(memory.read_text().replace("full avg10=15.50", "full avg10=1.00"))
    assert evidence(collector.collect(ctx)) == []
    memory.write_text(memory.read_text().replace("full avg10=1.00", "full avg10=50.00"))
    again = evidence(collector.collect(ctx))
    assert [e.captures["avg10"] for e in again] == ["0.5000"]


def test_cgroup_v1_job_is_said_once_not_an_error(fixture_roots) -> None:
    roots = fixture_roots("cgroup_v1")
    roots.proc("pressure").mkdir()
    roots.proc("pressure", "cpu").write_text("some avg10=0.00 avg60=0.00 avg300=0.00 total=1\n")
    collector = PsiCollector(roots)
    ctx = CollectContext(roots=roots, host="n", jobs=[Registration(pid=7001, job="j7")])
    first = collector.collect(ctx)
    notes = [e for e in first if isinstance(e, Event) and e.kind == "state"]
    assert len(notes) == 1 and "no per-cgroup PSI" in notes[0].body and notes[0].job == "j7"
    assert not [e for e in collector.collect(ctx) if isinstance(e, Event) and e.kind == "state"]


def test_this_host() -> None:
    collector = PsiCollector(Roots())
    ok, reason = collector.available()
    if not ok:
        pytest.skip(reason)
    out = collector.collect(
        CollectContext(roots=Roots(), host="h", jobs=[Registration(pid=os.getpid(), job="self")])
    )
    resources = {e.attrs["resource"] for e in out if isinstance(e, Event) and e.kind == "metric"}
    assert {"cpu", "memory", "io"} <= resources
