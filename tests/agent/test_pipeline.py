"""The pipeline: lines matched through the catalog, attribution, ids, the ring and metrics."""

from __future__ import annotations

import time

import pytest

from denpex.agent.jobs import JobTable
from denpex.agent.pipeline import Pipeline
from denpex.catalog import load_catalog
from denpex.core.collector import detector_evidence
from denpex.core.events import Event, metric
from denpex.core.roots import Roots
from denpex.core.wire import Registration

# the matcher, line splitter and ring buffer, compiled and pure Python (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("both_backends")

XID = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
OOM = (
    "Out of memory: Killed process 4242 (python) total-vm:1234kB, anon-rss:5678kB, "
    "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:100kB oom_score_adj:0"
)


@pytest.fixture
def pipeline() -> Pipeline:
    return Pipeline(load_catalog(), JobTable(Roots()), host="node7", ring_size=100)


def line(body: str, **kw) -> Event:
    return Event(body=body, ts_ns=time.time_ns(), source=kw.pop("source", "kmsg"), **kw)


def test_kernel_lines_become_evidence_with_their_stable_ids(pipeline):
    found = pipeline.ingest(
        [
            line(XID, attrs={"event_id": "kmsg:boot:17"}),
            line("an ordinary line"),
            line(OOM),
        ]
    )
    assert [e.category for e in found] == ["gpu.fallen_off_bus", "host.oom_killed"]
    assert found[0].id == "kmsg:boot:17"
    assert found[1].id.startswith("node7:") and found[1].id != found[0].id
    assert all(e.event.host == "node7" for e in found)
    assert pipeline.stats.lines == 3
    assert pipeline.stats.evidence_by_category[("gpu.fallen_off_bus", "critical")] == 1


def test_the_oom_victim_named_in_the_line_is_attributed_to_its_job(pipeline):
    pipeline.jobs.register(Registration(pid=4242, job="llama-70b", rank=5, tenant="research"))
    (evidence,) = pipeline.ingest([line(OOM)])
    event = evidence.event
    assert (event.job, event.rank, event.tenant, event.pid) == ("llama-70b", 5, "research", 4242)


def test_source_restricted_signatures_ignore_lines_from_other_sources(pipeline):
    # a Python traceback means something in a job's output, nothing in the kernel log
    traceback = "Traceback (most recent call last):"
    assert pipeline.ingest([line(traceback, source="kmsg")]) == []
    assert [e.signature for e in pipeline.ingest([line(traceback, source="log")])] == [
        "app.exception.python_traceback"
    ]


def test_detector_evidence_passes_through_with_an_id_and_attribution(pipeline):
    pipeline.jobs.register(Registration(pid=31337, job="j1"))
    event = Event(body="oom_kill 0 -> 1", source="cgroup", kind="state", pid=31337)
    found = pipeline.ingest(
        [
            detector_evidence(
                event,
                "host.oom_killed.cgroup_oom_kill",
                captures={"count": "1", "cgroup": "/slurm/job_1"},
            )
        ]
    )
    assert found[0].id and found[0].event.job == "j1"


def test_evidence_since_filters_by_arrival_pid_and_job(pipeline):
    pipeline.jobs.register(Registration(pid=4242, job="a"))
    pipeline.ingest([line(XID)])
    middle = time.time_ns()
    pipeline.ingest([line(OOM)])
    assert len(pipeline.evidence_since(0)) == 2
    assert [e.category for e in pipeline.evidence_since(middle)] == ["host.oom_killed"]
    assert [e.event.job for e in pipeline.evidence_since(0, pid=4242)] == ["a"]
    assert pipeline.evidence_since(0, job="b") == []


def test_metrics_keep_the_latest_value_and_expire(pipeline):
    cpu = {"resource": "cpu"}
    pipeline.ingest([metric("psi_some_avg10_ratio", 0.1, source="psi", labels=cpu)])
    pipeline.ingest([metric("psi_some_avg10_ratio", 0.3, source="psi", labels=cpu)])
    assert [v.value for v in pipeline.metric_values().values()] == [0.3]
    pipeline.metric_ttl_ns = 1_000_000  # 1 ms: the psi series is stale by the next ingest
    pipeline._next_expiry_ns = 0
    time.sleep(0.01)
    pipeline.ingest([metric("numa_hit_pages_total", 1, source="numa", counter=True)])
    assert [key[0] for key in pipeline.metric_values()] == ["numa_hit_pages_total"]


def test_a_failing_sink_is_counted_and_does_not_stop_the_pipeline(pipeline):
    received = []

    def broken(batch):
        raise ConnectionError("down")

    pipeline.evidence_sinks[:] = [broken, received.extend]
    pipeline.ingest([line(XID)])
    assert pipeline.stats.sink_errors == 1
    assert len(received) == 1
