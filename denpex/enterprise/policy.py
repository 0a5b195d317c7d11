"""The policy set: Cedar policies, their schema and the manifest (version, roles, actions),
loaded from the package's `policies/` folder or from a folder a deployment supplies.

It must never hand out a set whose policies fail to parse or to validate against the schema,
nor one with a policy lacking an `@id` (a denial names the policies that decided it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

_ID = re.compile(r'@id\("([^"]+)"\)')
_POLICY_START = re.compile(r"^\s*(permit|forbid)\s*\(", re.MULTILINE)


class PolicyError(ValueError):
    """A policy folder that cannot be used: says which file and why."""


@dataclass(frozen=True)
class PolicySet:
    """A loaded, validated policy set; `cedar` and `schema` are cedarpy handles."""

    version: str
    source: str  # where it was loaded from ("bundled" or a folder)
    roles: dict[str, tuple[str, ...]]  # role → the roles it extends
    explain: dict[str, str]  # role or action → what it means
    actions: tuple[str, ...]
    policy_ids: tuple[str, ...]
    cedar: Any
    schema: Any

    def role_entities(self) -> list[dict[str, Any]]:
        """The Cedar entities of the roles, each `in` the roles it extends."""
        return [
            {
                "uid": {"type": "Denpex::Role", "id": role},
                "attrs": {},
                "parents": [{"type": "Denpex::Role", "id": p} for p in parents],
            }
            for role, parents in self.roles.items()
        ]


def _cedarpy() -> Any:
    try:
        import cedarpy
    except ImportError:
        raise PolicyError(
            "authorisation needs the Cedar engine: pip install 'denpex[server]' (cedarpy)"
        ) from None
    return cedarpy


def _read(folder: Path | None, name: str) -> str:
    try:
        if folder is None:
            return resources.files("denpex.enterprise").joinpath("policies", name).read_text()
        return (folder / name).read_text()
    except OSError as exc:
        raise PolicyError(f"policy set: cannot read {name}: {exc.strerror or exc}") from None


def load_policies(folder: str | Path | None = None) -> PolicySet:
    """The policy set in `folder` (manifest.yaml, the schema, the .cedar files it names), or
    the bundled one when `folder` is None."""
    if folder is None:
        return _bundled()
    return _load(Path(folder))


@cache
def _bundled() -> PolicySet:
    return _load(None)


def _load(folder: Path | None) -> PolicySet:
    cedarpy = _cedarpy()
    where = "bundled" if folder is None else str(folder)
    try:
        manifest = yaml.safe_load(_read(folder, "manifest.yaml")) or {}
        roles = {
            str(name): tuple(str(p) for p in (entry or {}).get("extends") or ())
            for name, entry in (manifest.get("roles") or {}).items()
        }
        explain = {
            name: str((entry or {}).get("explain", "")) for name, entry in manifest["roles"].items()
        }
        actions = {str(k): str(v) for k, v in (manifest.get("actions") or {}).items()}
        files = [str(f) for f in manifest["files"]]
        version = str(manifest["version"])
        schema_text = _read(folder, str(manifest["schema"]))
    except (KeyError, TypeError, AttributeError, yaml.YAMLError) as exc:
        raise PolicyError(f"policy set {where}: manifest.yaml is malformed ({exc})") from None
    for role, parents in roles.items():
        for parent in parents:
            if parent not in roles:
                raise PolicyError(f"policy set {where}: role {role!r} extends unknown {parent!r}")
    _check_acyclic(roles, where)

    texts = []
    ids: list[str] = []
    for name in files:
        text = _read(folder, name)
        starts = len(_POLICY_START.findall(_strip_comments(text)))
        found = _ID.findall(text)
        if starts != len(found):
            raise PolicyError(f"policy set {where}: {name}: every policy needs an @id(...)")
        ids.extend(found)
        texts.append(text)
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise PolicyError(f"policy set {where}: policy ids used twice: {', '.join(duplicates)}")
    text = "\n".join(texts)
    try:
        schema = cedarpy.Schema.from_str(schema_text)
    except Exception as exc:  # cedarpy raises ValueError or its own errors
        raise PolicyError(f"policy set {where}: schema does not parse: {exc}") from None
    # every action of the manifest must exist in the schema: validate a policy naming them all
    every_action = ", ".join(f'Denpex::Action::"{a}"' for a in actions)
    probe = f"permit (principal, action in [{every_action}], resource);"
    for label, source in (("policies", text), ("manifest actions", probe)):
        result = cedarpy.validate_policies(source, schema)
        if not result.validation_passed:
            problems = "; ".join(str(e) for e in result.errors)[:2000]
            raise PolicyError(f"policy set {where}: {label} do not validate: {problems}")
    try:
        cedar = cedarpy.PolicySet.from_str(text)
    except Exception as exc:
        raise PolicyError(f"policy set {where}: policies do not parse: {exc}") from None
    explain.update(actions)
    return PolicySet(
        version=version,
        source=where,
        roles=roles,
        explain=explain,
        actions=tuple(actions),
        policy_ids=tuple(ids),
        cedar=cedar,
        schema=schema,
    )


def _strip_comments(text: str) -> str:
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def _check_acyclic(roles: dict[str, tuple[str, ...]], where: str) -> None:
    def visit(role: str, seen: tuple[str, ...]) -> None:
        if role in seen:
            raise PolicyError(f"policy set {where}: role {role!r} extends itself")
        for parent in roles[role]:
            visit(parent, (*seen, role))

    for role in roles:
        visit(role, ())


def bundled_roles() -> tuple[str, ...]:
    """The roles of the bundled manifest, read without the Cedar engine (for CLI choices)."""
    manifest = yaml.safe_load(_read(None, "manifest.yaml"))
    return tuple(manifest["roles"])
