"""Reading a YAML catalog (a list of entries: signatures, detectors) with the line of every
entry and key, and the checks every catalog entry shares (id, category, severity, action,
texts, refs).

Pure: parses text it is given and returns problems as (line, message); it never reads a file
and never stops at the first problem, so one run lists everything an author has to fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from denpex.core.diagnosis import ACTIONS
from denpex.core.events import SEVERITIES
from denpex.core.taxonomy import Taxonomy

# libyaml's loader when PyYAML was built with it (several times faster), else pure Python
YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
ID_RE = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_]+)+$")


@dataclass(slots=True)
class Entry:
    """One list item of a catalog file: its value, the line of each of its keys, its line."""

    data: Any
    key_lines: dict[str, int]
    line: int


def read_entries(text: str, name: str) -> tuple[list[Entry], list[str]]:
    """The entries of a catalog file's text and the problems that stop it being read at all
    (not YAML, not a list, duplicate keys), each as 'name:line: message'."""
    loader = YamlLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 0
        return [], [f"{name}:{line}: not valid YAML: {getattr(exc, 'problem', exc)}"]
    finally:
        loader.dispose()
    if root is None:
        return [], [f"{name}:1: empty file"]
    if not isinstance(root, yaml.SequenceNode):
        return [], [f"{name}:{root.start_mark.line + 1}: a catalog file is a list of entries"]
    entries: list[Entry] = []
    errors: list[str] = []
    constructor = YamlLoader("")
    for item in root.value:
        key_lines: dict[str, int] = {}
        if isinstance(item, yaml.MappingNode):
            for key_node, _ in item.value:
                key = str(key_node.value)
                if key in key_lines:
                    errors.append(f"{name}:{key_node.start_mark.line + 1}: duplicate key '{key}'")
                key_lines[key] = key_node.start_mark.line + 1
        data = constructor.construct_object(item, deep=True)
        entries.append(Entry(data, key_lines, item.start_mark.line + 1))
    return entries, errors


def str_list(value: Any) -> list[str] | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None


def common_problems(
    data: Mapping[str, Any],
    err: Callable[[str | None, str], None],
    taxonomy: Taxonomy,
    required: tuple[str, ...],
    optional: tuple[str, ...],
) -> None:
    """Report through `err(key, message)` missing and unknown keys, and what is wrong with
    the keys every catalog entry has: a dotted id that starts with its category, a taxonomy
    category, a severity, an action, non-empty summary and explain texts, refs."""
    for key in required:
        if key not in data:
            err(None, f"missing required key '{key}'")
    for key in data:
        if key not in required and key not in optional:
            err(key, f"unknown key '{key}'")
    entry_id = data.get("id")
    category = data.get("category")
    if not isinstance(entry_id, str) or not ID_RE.match(entry_id):
        err("id", f"id {entry_id!r} must be dotted lowercase words (e.g. gpu.fallen_off_bus.xid79)")
    if not isinstance(category, str) or category not in taxonomy or category == "unknown":
        err("category", f"category {category!r} is not a taxonomy id")
    elif isinstance(entry_id, str) and not entry_id.startswith(category + "."):
        err("id", f"id '{entry_id}' must start with its category '{category}.'")
    if data.get("severity") not in SEVERITIES:
        err("severity", f"severity must be one of {', '.join(SEVERITIES)}")
    if data.get("action") not in ACTIONS:
        err("action", f"action {data.get('action')!r} is not one of {', '.join(ACTIONS)}")
    for key in ("summary", "explain"):
        if key in data and (not isinstance(data[key], str) or not data[key].strip()):
            err(key, f"'{key}' must be a non-empty string")
    refs = data.get("refs")
    if "refs" in data and (str_list(refs) is None or not refs):
        err("refs", "refs must be a non-empty list of strings (URLs or document names)")
