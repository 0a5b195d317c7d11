"""The state machine table: every edge of machine.yaml, the illegal pairs, and the plans the
§7 actions imply (walked to their end with advance())."""

from __future__ import annotations

import copy
from importlib import resources

import pytest
import yaml

from denpex.core.diagnosis import ACTIONS
from denpex.remediation import machine as m
from denpex.remediation.backend import Operation
from denpex.remediation.machine import Event, IllegalTransition, MachineDataError, State

RAW = yaml.safe_load(resources.files("denpex.remediation").joinpath("machine.yaml").read_text())


def walk(steps, outcomes: dict[State, Event]) -> list[State]:
    """States entered from `detected` when each step ends with its outcome (default ok)."""
    state, seen = State.DETECTED, []
    state, _ = m.advance(steps, state, Event.START)
    while not m.info(state).terminal:
        seen.append(state)
        state, _ = m.advance(steps, state, outcomes.get(state, Event.OK))
    return [*seen, state]


def test_every_yaml_edge_is_a_transition() -> None:
    for src, edges in RAW["transitions"].items():
        for event, dst in edges.items():
            state, actions = m.step(State(src), Event(event))
            assert state is State(dst)
            kind = "close" if m.info(state).terminal else "run"
            assert actions[0].kind == kind and actions[0].state is state


@pytest.mark.parametrize("state", list(State))
def test_illegal_pairs_raise(state: State) -> None:
    legal = {e for (s, e) in m.machine().transitions if s is state}
    for event in set(Event) - legal:
        with pytest.raises(IllegalTransition):
            m.step(state, event)


def test_terminal_states_have_no_edges_and_others_have_failure_and_timeout_edges() -> None:
    for state, info in m.machine().states.items():
        edges = {e for (s, e) in m.machine().transitions if s is state}
        if info.terminal:
            assert not edges
        elif state is not State.DETECTED:
            assert {Event.FAILED, Event.TIMEOUT, Event.ERROR} <= edges
            assert info.op is not None and info.timeout_s > 0


def test_entering_a_step_runs_its_operation() -> None:
    state, actions = m.step(State.CORDON, Event.OK)
    assert state is State.DRAIN and actions == (m.Action("run", State.DRAIN, Operation.DRAIN),)


def test_drain_node_happy_path_and_its_branches() -> None:
    steps = m.plan_steps(["drain_node"])
    assert walk(steps, {}) == [
        State.CORDON,
        State.DRAIN,
        State.CHECKPOINT,
        State.EVICT,
        State.REROUTE,
        State.DIAGNOSTICS,
        State.RESUME,
        State.DONE,
    ]
    # failed diagnostics or a lemon host: RMA, never back to service
    for outcome in (Event.FAILED, Event.LEMON):
        path = walk(steps, {State.DIAGNOSTICS: outcome})
        assert path[-3:] == [State.DIAGNOSTICS, State.RMA, State.DONE]
        assert State.RESUME not in path
    # a failed checkpoint is recorded, eviction follows; a failed cordon stops everything
    assert State.EVICT in walk(steps, {State.CHECKPOINT: Event.TIMEOUT})
    assert walk(steps, {State.CORDON: Event.ERROR}) == [State.CORDON, State.FAILED]


def test_rma_plan_skips_resume_and_retry_only_reroutes() -> None:
    assert walk(m.plan_steps(["rma"]), {})[-3:] == [State.REROUTE, State.RMA, State.DONE]
    assert walk(m.plan_steps(["retry_job"]), {}) == [State.REROUTE, State.DONE]
    assert walk(m.plan_steps(["fix_code"]), {}) == [State.DONE]


def test_plans_cover_the_vocabulary_and_merge_in_table_order() -> None:
    assert set(m.machine().plans) == set(ACTIONS)
    merged = m.plan_steps(["retry_job", "rma"])
    assert merged == tuple(s for s in State if s in merged)
    with pytest.raises(ValueError):
        m.plan_steps(["reboot"])


def test_data_that_breaks_the_rules_is_refused() -> None:
    bad = copy.deepcopy(RAW)
    del bad["transitions"]["evict"]["timeout"]
    with pytest.raises(MachineDataError, match="evict"):
        m._parse(bad)
    bad = copy.deepcopy(RAW)
    bad["plans"]["reset_gpu"] = ["cordon", "resume"]
    with pytest.raises(MachineDataError, match="without diagnostics"):
        m._parse(bad)
    bad = copy.deepcopy(RAW)
    bad["transitions"]["done"] = {"ok": "detected"}
    with pytest.raises(MachineDataError, match="terminal"):
        m._parse(bad)
