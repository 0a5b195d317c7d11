"""The collector registry is complete: every concrete Collector class in denpex is in
denpex.agent.registry.COLLECTORS (no plugin discovery: a collector left out would silently
never run), names are unique, and every stability is one the agent knows."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import denpex
from denpex.agent.registry import COLLECTORS
from denpex.core.collector import STABILITIES, Collector


def every_collector_class() -> set[type[Collector]]:
    found: set[type[Collector]] = set()
    for module in pkgutil.walk_packages(denpex.__path__, "denpex."):
        if module.name.endswith("__main__"):
            continue
        loaded = importlib.import_module(module.name)
        for _, cls in inspect.getmembers(loaded, inspect.isclass):
            if issubclass(cls, Collector) and not inspect.isabstract(cls):
                found.add(cls)
    return found


def test_every_collector_class_is_registered() -> None:
    missing = sorted(c.__qualname__ for c in every_collector_class() - set(COLLECTORS))
    assert not missing, f"add to denpex/agent/registry.py COLLECTORS: {missing}"


def test_collector_names_are_unique() -> None:
    names = [c.name for c in COLLECTORS]
    assert len(names) == len(set(names)), names


def test_every_collector_says_how_stable_it_is() -> None:
    assert {c.name: c.stability for c in COLLECTORS if c.stability not in STABILITIES} == {}
