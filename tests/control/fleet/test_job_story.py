"""A job whose ranks each reported on their own (a wrapper per rank, one report each): the
fleet diagnoses the job over all its reports and its hosts' agent events together, and names
the host the peers' timeouts point at (rule job_story) rather than a rank that only waited."""

from __future__ import annotations

from denpex.control.fleet import correlate, load_fleet_rules
from denpex.control.fleet.model import EvidenceRecord, FleetView, JobOutcome
from denpex.control.fleet.reports import job_outcomes, outcome_from_report
from denpex.control.fleet.strikes import build_strikes
from tests.control.fleet.fleet_cases import at

HOSTS = ("n0", "n1", "n2", "n3")
GLOO = "RuntimeError: [gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 15000ms for recv"


def timeout(report: str, rank: int, hours: float) -> EvidenceRecord:
    return EvidenceRecord(
        f"{report}/e1",
        at(hours),
        HOSTS[rank],
        "nccl.timeout",
        "error",
        "log",
        signature="nccl.timeout.gloo_wait_timeout",
        rank=rank,
        job="train",
        body=GLOO,
    )


def report(rank: int, *, timed_out: bool, signal: str | None = None) -> JobOutcome:
    """Rank `rank`'s own report: its gloo timeout (what its wrapper saw), or nothing."""
    rid = f"r{rank}"
    timeline = (timeout(rid, rank, 10.0 + rank / 3600),) if timed_out else ()
    return JobOutcome(
        tenant="t",
        job="train",
        hosts=(HOSTS[rank],),
        ended_ns=at(10.01),
        status="failed",
        category="nccl.timeout" if timed_out else "unknown",
        root_host=HOSTS[rank] if timed_out else None,
        root_rank=rank if timed_out else None,
        confidence=0.4 if timed_out else 0.0,
        rule="symptoms_only" if timed_out else "no_evidence",
        evidence=(f"{rid}/e1",) if timed_out else (),
        started_ns=at(9.0),
        ranks={rank: HOSTS[rank]},
        exit_code=None if signal else 1,
        exit_signal=signal,
        timeline=timeline,
    )


def stories(view: FleetView) -> list[tuple[str, str, str]]:
    found = correlate(view, at(10.1), load_fleet_rules())
    return [(c.component, c.category, c.action) for c in found if c.rule == "job_story"]


def test_the_rank_its_peers_waited_for_is_named_though_it_reported_no_timeout():
    # rank 2 stopped (SIGSTOP, then killed): it never timed out; ranks 0, 1, 3 did
    reports = [report(r, timed_out=r != 2, signal="SIGKILL" if r == 2 else None) for r in range(4)]
    assert stories(FleetView(jobs=reports)) == [("n2", "train.hang", "drain_node")]
    (strike,) = [s for s in build_strikes(FleetView(jobs=reports), at(10.1), load_fleet_rules())]
    assert (strike.host, strike.rule) == ("n2", "absent_from_collective")


def test_the_host_whose_link_went_down_is_named_though_every_rank_timed_out():
    reports = [report(r, timed_out=True) for r in range(4)]
    link_down = EvidenceRecord(
        "k1",
        at(10.0) - 15 * 10**9,  # the port dropped; the ranks' 15 s timeouts follow
        "n2",
        "net.link_down",
        "warning",
        "kmsg",
        signature="net.link_down.mlx5_link_down",
        body="mlx5_core 0000:3b:00.0 eth0: Link down",
    )
    view = FleetView(jobs=reports, host_events=[link_down])
    assert stories(view) == [("n2", "net.link_down", "drain_node")]


def test_ranks_that_all_only_waited_blame_no_host():
    reports = [report(r, timed_out=True) for r in range(4)]
    assert stories(FleetView(jobs=reports)) == []


def test_one_report_of_a_multi_host_job_is_the_job_already():
    alone = report(0, timed_out=True)
    assert stories(FleetView(jobs=[alone])) == []
    assert job_outcomes([alone]) == [alone]


def test_a_report_from_one_host_places_its_ranks_there():
    diagnosis = {"status": "failed", "root_cause": {}, "timeline": []}
    body = {"id": "r2", "job": "train", "hosts": ["n2"], "ranks": [2], "ended_ns": at(10)}
    outcome = outcome_from_report({**body, "diagnosis": diagnosis}, tenant="t")
    assert outcome.ranks == {2: "n2"}
    (joined,) = job_outcomes([outcome, report(0, timed_out=True)])
    assert joined.reports == 2 and joined.ranks == {2: "n2", 0: "n0"}
    assert set(joined.hosts) == {"n0", "n2"}


def test_the_replica_that_diverged_is_named_though_every_rank_exited_zero():
    sdc = EvidenceRecord(
        "r2/e1",
        at(10.0),
        "n2",
        "train.sdc",
        "error",
        "sdk",
        signature="train.sdc.replica_mismatch",
        rank=2,
        job="train",
        body="replica checksums differ: rank 2",
    )
    corrupted = JobOutcome(
        tenant="t",
        job="train",
        hosts=("n2",),
        ended_ns=at(10.01),
        status="failed",
        category="train.sdc",
        root_host="n2",
        root_rank=2,
        confidence=0.89,
        rule="integrity_on_success",
        evidence=("r2/e1",),
        started_ns=at(9.0),
        ranks={2: "n2"},
        exit_code=0,
        timeline=(sdc,),
    )
    fine = [
        JobOutcome(
            tenant="t",
            job="train",
            hosts=(HOSTS[r],),
            ended_ns=at(10.01),
            status="ok",
            started_ns=at(9.0),
            ranks={r: HOSTS[r]},
            exit_code=0,
        )
        for r in (0, 1, 3)
    ]
    assert stories(FleetView(jobs=[*fine, corrupted])) == [("n2", "train.sdc", "drain_node")]
