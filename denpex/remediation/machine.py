"""The remediation state machine of DESIGN §7, read from machine.yaml: states, events, the
transition table with its failure and timeout edges, and the plans each §7 action implies.

Pure: `step(state, event)` and `advance(plan_steps, state, event)` do no I/O and read no clock;
the executor performs the actions they return. An event a state has no edge for raises
IllegalTransition, never a guess.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from importlib import resources
from typing import Any

import yaml

from denpex.core.diagnosis import ACTIONS
from denpex.remediation.backend import Operation


class State(StrEnum):
    DETECTED = "detected"
    CORDON = "cordon"
    DRAIN = "drain"
    CHECKPOINT = "checkpoint"
    EVICT = "evict"
    REROUTE = "reroute"
    DIAGNOSTICS = "diagnostics"
    RESUME = "resume"
    RMA = "rma"
    DONE = "done"
    FAILED = "failed"
    REJECTED = "rejected"


class Event(StrEnum):
    START = "start"
    OK = "ok"
    FAILED = "failed"
    ERROR = "error"
    TIMEOUT = "timeout"
    SKIP = "skip"
    LEMON = "lemon"
    REJECT = "reject"


# every non-terminal state must say where each of these leads
REQUIRED_EDGES = (Event.FAILED, Event.ERROR, Event.TIMEOUT, Event.SKIP, Event.REJECT)


class IllegalTransition(ValueError):
    """An event the state has no edge for."""


class MachineDataError(ValueError):
    """machine.yaml breaks the machine's rules (unknown name, missing edge)."""


@dataclass(frozen=True, slots=True)
class StateInfo:
    state: State
    op: Operation | None
    reversible: bool
    idempotent: bool
    timeout_s: float
    terminal: bool
    explain: str


@dataclass(frozen=True, slots=True)
class Action:
    """What the executor does on entering a state: run a backend operation, or (on entering a
    terminal state) close the plan."""

    kind: str  # "run" | "close"
    state: State
    op: Operation | None = None


@dataclass(frozen=True, slots=True)
class Machine:
    states: Mapping[State, StateInfo]
    transitions: Mapping[tuple[State, Event], State]
    plans: Mapping[str, tuple[State, ...]]
    events: Mapping[Event, str]


def _parse(raw: Mapping[str, Any]) -> Machine:
    try:
        states: dict[State, StateInfo] = {}
        for name, entry in raw["states"].items():
            state = State(name)
            terminal = bool(entry.get("terminal", False))
            op = None if terminal or "op" not in entry else Operation(entry["op"])
            if not terminal and state is not State.DETECTED and op is None:
                raise MachineDataError(f"machine.yaml: state {name!r} has no op")
            states[state] = StateInfo(
                state,
                op,
                bool(entry.get("reversible", True)),
                bool(entry.get("idempotent", True)),
                float(entry.get("timeout_s", 0)),
                terminal,
                str(entry["explain"]),
            )
        events = {Event(name): str(text) for name, text in raw["events"].items()}
        transitions: dict[tuple[State, Event], State] = {}
        for name, edges in raw["transitions"].items():
            for event, target in edges.items():
                transitions[State(name), Event(event)] = State(target)
        plans = {
            action: tuple(sorted((State(s) for s in steps), key=list(State).index))
            for action, steps in raw["plans"].items()
        }
    except ValueError as exc:
        raise MachineDataError(f"machine.yaml: {exc}") from None
    _check(states, transitions, plans, events)
    return Machine(states, transitions, plans, events)


def _check(
    states: Mapping[State, StateInfo],
    transitions: Mapping[tuple[State, Event], State],
    plans: Mapping[str, tuple[State, ...]],
    events: Mapping[Event, str],
) -> None:
    if set(states) != set(State) or set(events) != set(Event):
        raise MachineDataError("machine.yaml: states and events must match the enums")
    for state, info in states.items():
        edges = {event for (src, event) in transitions if src is state}
        if info.terminal and edges:
            raise MachineDataError(f"machine.yaml: terminal state {state} has edges")
        if not info.terminal and state is not State.DETECTED:
            missing = [str(e) for e in REQUIRED_EDGES if e not in edges]
            if missing:
                raise MachineDataError(f"machine.yaml: state {state} lacks edges {missing}")
    if set(plans) != set(ACTIONS):
        raise MachineDataError("machine.yaml: plans must name every action of DESIGN §7")
    for action, steps in plans.items():
        if State.RESUME in steps and State.DIAGNOSTICS not in steps:
            raise MachineDataError(f"machine.yaml: plan {action} resumes without diagnostics")


@cache
def machine() -> Machine:
    text = resources.files("denpex.remediation").joinpath("machine.yaml").read_text()
    return _parse(yaml.safe_load(text))


def info(state: State) -> StateInfo:
    return machine().states[state]


def step(state: State, event: Event) -> tuple[State, tuple[Action, ...]]:
    """The next state and what to do on entering it. Raises IllegalTransition."""
    try:
        target = machine().transitions[state, event]
    except KeyError:
        raise IllegalTransition(f"no transition from {state} on {event}") from None
    entered = info(target)
    if entered.terminal:
        return target, (Action("close", target),)
    return target, (Action("run", target, entered.op),)


def advance(
    plan_steps: Collection[State], state: State, event: Event
) -> tuple[State, tuple[Action, ...]]:
    """step(), then past every state the plan does not hold (their `skip` edges), so the
    result is a state of the plan or a terminal one."""
    target, actions = step(state, event)
    while not info(target).terminal and target not in plan_steps:
        target, actions = step(target, Event.SKIP)
    return target, actions


def plan_steps(actions: Collection[str]) -> tuple[State, ...]:
    """The steps a plan for these §7 actions holds (the union, in table order)."""
    table = machine().plans
    unknown = [a for a in actions if a not in table]
    if unknown:
        raise ValueError(f"unknown remediation actions {unknown} (DESIGN §7 vocabulary)")
    steps = {s for a in actions for s in table[a]}
    return tuple(s for s in State if s in steps)
