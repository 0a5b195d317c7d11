"""A job report (placement + a real `denpex.diagnosis/v1` from the engine) as a JobOutcome."""

from __future__ import annotations

from denpex.control.fleet.reports import outcome_from_report, parse_ts
from denpex.core.events import Event, Evidence, format_ts
from denpex.diagnosis import DiagnosisInput, diagnose

T0 = 1_798_761_600_000_000_000


def report() -> dict:
    evidence = [
        Evidence(
            id="e1",
            event=Event(
                body="RuntimeError: CUDA error: an illegal memory access was encountered",
                ts_ns=T0 + 5_000_000_000,
                host="node2",
                rank=11,
                seq=1,
            ),
            signature="cuda.illegal_address.illegal_memory_access",
            category="cuda.illegal_address",
            severity="error",
        ),
        Evidence(
            id="e2",
            event=Event(
                body="Watchdog caught collective operation timeout",
                ts_ns=T0 + 600_000_000_000,
                host="node1",
                rank=0,
                seq=2,
            ),
            signature="nccl.timeout.watchdog_collective_timeout",
            category="nccl.timeout",
            severity="error",
        ),
    ]
    diagnosis = diagnose(DiagnosisInput(evidence, exit_code=1)).to_dict()
    gpus = [
        {"host": host, "pci": f"0000:{bus}:00.0", "serial": f"{host}-{bus}", "rank": rank}
        for rank, (host, bus) in enumerate(
            [("node1", "18"), ("node1", "2a")]
            + [("node2", b) for b in ("18", "2a", "3b", "4c", "5d", "9a", "ab", "bc", "cc", "dd")]
        )
    ]
    return {
        "id": "rep-7",
        "job": "4242",
        "user": "alice",
        "hosts": ["node1", "node2"],
        "ranks": list(range(12)),
        "scheduler": {"slurm_job_id": "4242"},
        "ended_ns": T0 + 700_000_000_000,
        "started_ns": T0,
        "name": "llama-pretrain",
        "gpus": gpus,
        "labels": {"driver": "550.54.15", "image": "site/llm:2.3"},
        "diagnosis": diagnosis,
    }


def test_the_report_root_cause_and_placement_become_the_outcome():
    outcome = outcome_from_report(report(), tenant="research")
    assert outcome.failed and outcome.category == "cuda.illegal_address"
    assert (outcome.root_host, outcome.root_rank) == ("node2", 11)
    assert outcome.root_gpu is not None and outcome.root_gpu.serial == "node2-dd"
    assert outcome.evidence == ("rep-7/e1",)
    assert outcome.ranks[11] == "node2" and outcome.hosts == ("node1", "node2")
    assert outcome.labels == {"driver": "550.54.15", "image": "site/llm:2.3"}
    assert (outcome.name, outcome.user, outcome.exit_code) == ("llama-pretrain", "alice", 1)


def test_timeline_lines_keep_their_time_host_rank_and_a_report_scoped_id():
    outcome = outcome_from_report(report(), tenant="research")
    by_id = {r.id: r for r in outcome.timeline}
    first = by_id["rep-7/e1"]
    assert (first.host, first.rank, first.category, first.job) == (
        "node2",
        11,
        "cuda.illegal_address",
        "4242",
    )
    assert first.ts_ns == T0 + 5_000_000_000
    assert by_id["rep-7/e2"].category == "nccl.timeout"


def test_a_minimal_report_without_the_optional_fields():
    body = report()
    for key in ("started_ns", "name", "gpus", "labels"):
        del body[key]
    outcome = outcome_from_report(body, tenant="research")
    assert outcome.root_gpu is None and outcome.gpus == () and outcome.labels == {}
    assert outcome.started_ns is None and outcome.name is None


def test_times_round_trip_with_the_json_format():
    assert parse_ts(format_ts(T0 + 123_000_000)) == T0 + 123_000_000
    assert parse_ts(None) is None and parse_ts("not a time") is None
