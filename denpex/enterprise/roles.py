"""Roles and the actions they allow, loaded from roles.yaml (data, not code).

It must never grant an action that roles.yaml does not name: an unknown role allows nothing.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

import yaml


@cache
def _table() -> dict[str, frozenset[str]]:
    raw = yaml.safe_load(resources.files("denpex.enterprise").joinpath("roles.yaml").read_text())
    resolved: dict[str, frozenset[str]] = {}

    def resolve(name: str, seen: tuple[str, ...] = ()) -> frozenset[str]:
        if name in seen:
            raise ValueError(f"roles.yaml: role {name!r} extends itself")
        if name not in resolved:
            entry = raw[name]
            base = resolve(entry["extends"], (*seen, name)) if entry.get("extends") else frozenset()
            resolved[name] = base | frozenset(entry.get("actions") or ())
        return resolved[name]

    for role in raw:
        resolve(role)
    return resolved


ROLES: tuple[str, ...] = tuple(_table())


def actions_of(role: str) -> frozenset[str]:
    """Every action `role` allows (none for a role roles.yaml does not define)."""
    return _table().get(role, frozenset())


def all_actions() -> frozenset[str]:
    return frozenset().union(*_table().values())
