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
