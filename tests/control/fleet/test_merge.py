"""Incident grouping and dedupe: one incident per cause, jobs attached, growth instead of
twins, recovery resolving a host's and its GPUs' incidents — and merge over correlate's
real output as a fleet's history grows."""

from __future__ import annotations

from dataclasses import replace

from denpex.control.fleet import correlate, merge
from denpex.control.fleet.model import Incident, IncidentCandidate
from tests.control.fleet.fleet_cases import at, build_view


def candidate(**kw) -> IncidentCandidate:
    base = dict(
        rule="repeat_offender",
        kind="host",
        component="h05",
        category="host.segfault",
        confidence=0.8,
        evidence=("e1", "e2"),
        jobs=("j1", "j2"),
        hosts=("h05",),
        first_ns=at(1),
        last_ns=at(2),
        explanation="host h05 in 2 failed jobs",
        action="drain_node",
        tenants=("t1",),
    )
    base.update(kw)
    return IncidentCandidate(**base)


def stored(c: IncidentCandidate, ident: str = "inc-1", **kw) -> Incident:
    incident = Incident(
        id=ident,
        kind=c.kind,
        component=c.component,
        category=c.category,
        confidence=c.confidence,
        rules=(c.rule,),
        evidence=c.evidence,
        jobs=c.jobs,
        hosts=c.hosts,
        first_ns=c.first_ns,
        last_ns=c.last_ns,
        explanation=c.explanation,
        action=c.action,
        tenants=c.tenants,
    )
    return replace(incident, **kw)


def test_a_new_cause_opens_one_incident_without_an_id():
    result = merge([], [candidate()])
    assert [i.key for i in result.opened] == [("host", "h05")]
    opened = result.opened[0]
    assert opened.id is None and opened.state == "open"
    assert opened.rules == ("repeat_offender",) and opened.jobs == ("j1", "j2")
    assert not result.updated and not result.resolved and result.changed


def test_the_same_cause_with_nothing_new_changes_nothing():
    c = candidate()
    result = merge([stored(c)], [c])
    assert not result.changed


def test_a_growing_cause_grows_its_incident_with_exactly_what_is_new():
    old = candidate()
    grown = candidate(
        evidence=("e1", "e2", "e3"), jobs=("j1", "j2", "j3"), last_ns=at(5), confidence=0.9
    )
    result = merge([stored(old)], [grown])
    assert not result.opened
    (update,) = result.updated
    assert update.added_evidence == ("e3",) and update.added_jobs == ("j3",)
    assert update.incident.id == "inc-1"
    assert update.incident.evidence == ("e1", "e2", "e3")
    assert update.incident.last_ns == at(5) and update.incident.confidence == 0.9


def test_growth_never_lowers_confidence_nor_forgets_evidence_that_left_the_window():
    old = stored(candidate(evidence=("e0", "e1", "e2"), confidence=0.95))
    later = candidate(evidence=("e2", "e9"), jobs=("j9",), confidence=0.7)
    (update,) = merge([old], [later]).updated
    assert update.incident.evidence == ("e0", "e1", "e2", "e9")
    assert update.incident.jobs == ("j1", "j2", "j9")
    assert update.incident.confidence == 0.95


def test_two_rules_naming_one_cause_make_one_incident():
    a = candidate(rule="hardware_in_job", kind="gpu", component="S1", evidence=("x1",), jobs=())
    b = candidate(
        rule="repeat_offender",
        kind="gpu",
        component="S1",
        evidence=("e1",),
        jobs=("j1",),
        confidence=0.9,
    )
    (opened,) = merge([], [a, b]).opened
    assert opened.rules == ("hardware_in_job", "repeat_offender")
    assert set(opened.evidence) == {"x1", "e1"} and opened.confidence == 0.9


def test_an_acknowledged_incident_grows_and_a_resolved_one_is_not_reopened_by_merge():
    old = candidate()
    acknowledged = stored(old, state="acknowledged")
    grown = candidate(evidence=("e1", "e2", "e3"))
    (update,) = merge([acknowledged], [grown]).updated
    assert update.incident.state == "acknowledged"
    resolved = stored(old, state="resolved")
    result = merge([resolved], [grown])
    assert [i.id for i in result.opened] == [None] and not result.updated


def test_recovery_resolves_the_host_and_its_gpus_but_not_its_switch():
    host = stored(candidate(), "inc-1")
    gpu = stored(candidate(kind="gpu", component="h05-g3"), "inc-2")
    other_gpu = stored(candidate(kind="gpu", component="h06-g1", hosts=("h06",)), "inc-3")
    switch = stored(candidate(kind="switch", component="sw0", hosts=("h04", "h05")), "inc-4")
    recovered = candidate(
        rule="recovered", verdict="recovered", evidence=(), jobs=(), action="none"
    )
    result = merge([host, gpu, other_gpu, switch], [recovered])
    assert sorted(r.incident.id for r in result.resolved) == ["inc-1", "inc-2"]
    assert all(r.rule == "recovered" for r in result.resolved)


def test_suspicion_in_the_same_pass_wins_over_recovery():
    host = stored(candidate(), "inc-1")
    recovered = candidate(rule="recovered", verdict="recovered", evidence=(), jobs=())
    again = candidate(evidence=("e1", "e2", "e7"))
    result = merge([host], [recovered, again])
    assert not result.resolved and len(result.updated) == 1


def test_a_gpu_blamed_before_the_rollout_was_known_is_resolved_by_it():
    gpu = stored(
        candidate(kind="gpu", component="h05-g1", jobs=("j1", "j2"), rule="hardware_in_job"),
        "inc-1",
    )
    other = stored(
        candidate(kind="host", component="h09", jobs=("j1", "j7"), hosts=("h09",)), "inc-2"
    )
    rollout = candidate(
        rule="fleet_wide",
        kind="driver",
        component="driver=bad",
        jobs=("j1", "j2", "j3"),
        evidence=("e1", "e2", "e3"),
        hosts=("h05", "h06", "h07"),
        action="none",
    )
    result = merge([gpu, other], [rollout])
    assert [i.key for i in result.opened] == [("driver", "driver=bad")]
    (resolution,) = result.resolved
    assert resolution.incident.id == "inc-1" and resolution.rule == "fleet_wide"
    assert resolution.explanation.startswith("explained by driver driver=bad")


CASE = {
    "fleet": {"hosts": 64},
    "background": {"clean_jobs": 6},
    "jobs": [
        {"id": "a1", "hosts": ["h05", "h06"], "end": 10, "category": "host.segfault"},
        {"id": "b1", "hosts": ["h05"], "end": 40, "category": "app.exception"},
        {"id": "c1", "hosts": ["h05", "h20"], "end": 90, "category": "cuda.illegal_address"},
    ],
    "now": 100,
}


def test_a_correlation_loop_keeps_one_incident_as_a_host_keeps_failing():
    view, now = build_view(CASE)
    first = merge([], correlate(view, now))
    (incident,) = first.opened
    incident = replace(incident, id="inc-1")
    assert incident.jobs == ("a1", "b1", "c1")
    assert not merge([incident], correlate(view, now)).changed  # the next pass: nothing new

    case = dict(
        CASE,
        jobs=[
            *CASE["jobs"],
            {"id": "d1", "hosts": ["h05"], "end": 101, "category": "host.segfault"},
        ],
    )
    view, _ = build_view(dict(case, now=102))
    result = merge([incident], correlate(view, at(102)))
    assert not result.opened
    (update,) = result.updated
    assert update.added_jobs == ("d1",) and update.incident.id == "inc-1"


def test_a_resolved_cause_is_not_opened_again_for_the_jobs_it_held():
    closed = stored(candidate(), state="resolved")
    assert not merge([], [candidate()], [closed]).changed  # an operator closed that story
    again = merge([], [candidate(jobs=("j1", "j2", "j3"))], [closed])
    assert [i.jobs for i in again.opened] == [("j1", "j2", "j3")]  # a new failed job: anew
    other = candidate(component="h06", jobs=("j9",))
    assert [i.key for i in merge([], [candidate(), other], [closed]).opened] == [("host", "h06")]
