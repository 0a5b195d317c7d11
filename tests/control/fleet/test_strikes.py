"""Strikes: a failed job re-diagnosed by the one engine with the agents' host events on
its hosts joined in (attributed to the job or the host), and agent errors on idle hardware."""

from __future__ import annotations

from denpex.control.fleet import load_fleet_rules
from denpex.control.fleet.model import EvidenceRecord
from denpex.control.fleet.strikes import as_evidence, build_strikes, normal_pci, rediagnose
from tests.control.fleet.fleet_cases import at, build_view

CASE = {
    "fleet": {"hosts": 16},
    "jobs": [
        {
            "id": "a1",
            "hosts": ["h07", "h08"],
            "start": 5,
            "end": 10,
            "category": "nccl.system_error",
            "root": "h07",
            "rank": 1,
        },
    ],
    "events": [
        ["x1", "h07", 9.99, "gpu.ecc_uncorrectable", "critical", "kmsg", 3],
        ["x2", "h09", 9.99, "gpu.fallen_off_bus", "critical", "kmsg", 0],
        ["x3", "h08", 2.0, "gpu.row_remap", "error", "kmsg", 1],
    ],
    "now": 12,
}


def test_pci_addresses_have_one_spelling():
    assert normal_pci("00000000:3B:00.0") == normal_pci("0000:3b:00") == "0000:3b:00"
    assert normal_pci(None) is None


def test_a_job_strike_names_the_gpu_the_joined_xid_names():
    view, now = build_view(CASE)
    strikes = build_strikes(view, now, load_fleet_rules())
    job_strikes = [s for s in strikes if s.job is not None]
    (strike,) = job_strikes
    assert strike.category == "gpu.ecc_uncorrectable" and strike.hardware
    assert strike.gpu is not None and strike.gpu.serial == "h07-g3"
    assert "x1" in strike.evidence and "a1-e1" in strike.evidence  # both layers cited


def test_events_outside_the_job_are_strikes_of_their_own():
    view, now = build_view(CASE)
    strikes = build_strikes(view, now, load_fleet_rules())
    agent = sorted((s.host, s.category) for s in strikes if s.job is None)
    # x2: another host; x3: before the job started (outside the join window)
    assert agent == [("h08", "gpu.row_remap"), ("h09", "gpu.fallen_off_bus")]


def test_joined_host_events_are_attributed_to_the_job_or_to_its_host():
    view, _ = build_view(CASE)
    job = view.jobs[0]
    mine = EvidenceRecord(
        "m1", at(9.9), "h07", "host.oom_killed", "critical", "kmsg", gpu_pci="0000:3b:00"
    )
    other = EvidenceRecord(
        "o1", at(9.9), "h07", "host.oom_killed", "critical", "kmsg", gpu_pci="0000:ff:00"
    )
    # the same events give the same answer (and the second call is served from memory)
    assert rediagnose(job, [mine]) == rediagnose(job, [mine])
    assert as_evidence(mine, 1, job).event.attrs["attribution"] == "job"
    assert as_evidence(other, 1, job).event.attrs["attribution"] == "host"
    assert "attribution" not in as_evidence(mine, 1, None).event.attrs
