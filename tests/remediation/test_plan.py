"""Plans derived from incidents: proposals from the incident's own action or its evidence,
one plan per host, the target's kind from the component."""

from __future__ import annotations

from denpex.remediation.backend import TargetKind
from denpex.remediation.machine import State
from denpex.remediation.plan import Proposal, derive_plans, proposals_of

JOB_INCIDENT = {
    "id": 7,
    "rule": "job_root_cause",
    "category": "gpu.fallen_off_bus",
    "component": {"kind": "job", "id": "4242"},
    "title": "job 4242: gpu.fallen_off_bus on n2",
}


def test_job_incident_plans_from_its_evidence() -> None:
    evidence = [
        {"host": "n2", "action": "drain_node", "attrs": {"pci": "0000:3b:00"}},
        {"host": "n1", "action": "none", "attrs": {}},
        {"host": "n2", "action": "rma", "attrs": {}},
        {"host": None, "action": "retry_job", "attrs": {}},
    ]
    proposals = proposals_of(JOB_INCIDENT, evidence)
    assert Proposal("drain_node", "n2", "0000:3b:00") in proposals
    plans = derive_plans(JOB_INCIDENT, proposals, pool_of={"n2": "gpu"})
    assert len(plans) == 1  # n1 proposes nothing, the host-less retry cannot be acted on
    plan = plans[0]
    assert plan.target.host == "n2" and plan.target.pool == "gpu"
    assert plan.target.kind is TargetKind.GPU and plan.target.device == "0000:3b:00"
    assert plan.actions == ("drain_node", "rma")
    assert plan.steps[0] is State.CORDON and State.RMA in plan.steps
    assert plan.to_dict()["steps"][0] == "cordon"


def test_incident_with_its_own_action_on_a_switch() -> None:
    incident = {
        "id": 9,
        "rule": "shared_component",
        "category": "net.link_down",
        "component": {"kind": "switch", "id": "leaf3", "host": "n5"},
        "action": "check_fabric",
        "title": "leaf3 flaps",
    }
    plans = derive_plans(incident, proposals_of(incident, []), pool_of={})
    assert [(p.target.kind, p.target.host, p.target.device) for p in plans] == [
        (TargetKind.SWITCH, "n5", "leaf3")
    ]
    assert not plans[0].acts  # check_fabric: nothing a node scheduler does


def test_no_proposals_no_plans() -> None:
    assert derive_plans(JOB_INCIDENT, proposals_of(JOB_INCIDENT, []), pool_of={}) == []


def test_a_diagnosis_target_is_placed_on_a_host_the_incident_names() -> None:
    incident = {**JOB_INCIDENT, "hosts": ["n1", "n2"]}
    actions = [
        {"action": "reduce_memory", "target": "rank 3 on n2"},  # the engine's rank form
        {"action": "retry_job", "target": "train-llama-70b"},  # a job, not a host
        {"action": "drain_node", "target": "n1"},
        {"action": "fix_code", "target": "rank 2"},  # a rank with no host
    ]
    proposals = proposals_of(incident, [], actions)
    assert [p.host for p in proposals] == ["n2", None, "n1", None]
    plans = derive_plans(incident, proposals, pool_of={})
    assert [p.target.host for p in plans] == ["n1", "n2"]


def test_a_fleet_gpu_incident_is_planned_on_the_gpus_host() -> None:
    by_pci = {
        "id": 11,
        "rule": "repeat_offender",
        "category": "gpu.xid",
        "component": {"kind": "gpu", "id": "gpu-a07/0000:3b:00"},
        "hosts": ["gpu-a07"],
        "action": "drain_node",
        "title": "Xid 79 again",
    }
    by_serial = {**by_pci, "component": {"kind": "gpu", "id": "1321021012345"}}
    for incident in (by_pci, by_serial):
        [plan] = derive_plans(incident, proposals_of(incident, []), pool_of={})
        assert plan.target.host == "gpu-a07" and plan.target.kind is TargetKind.GPU
    unplaced = {**by_serial, "hosts": ["a", "b"]}  # a serial seen on two hosts: no guess
    assert derive_plans(unplaced, proposals_of(unplaced, []), pool_of={}) == []


def test_an_action_outside_the_vocabulary_is_left_out_not_raised() -> None:
    proposals = [Proposal("check_link", "n2"), Proposal("drain_node", "n2")]
    [plan] = derive_plans(JOB_INCIDENT, proposals, pool_of={})
    assert plan.actions == ("drain_node",)
    assert "unknown actions left out: check_link" in plan.reason
