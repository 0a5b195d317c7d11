"""The detector catalog (`detectors.yaml`): every evidence id denpex emits that is not a
signature's regex match — a threshold, a counter, a kernel event, an SDK check — with its
category, severity, action, summary template and explanation; and the one constructor of
detector evidence, used by the collectors, the wrapper and the training SDK alike.

Loading validates the whole file and lists every problem as file:line. Building evidence
for an id the catalog does not hold raises: every id a user can see is explained here.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from denpex.core.diagnosis import ACTIONS
from denpex.core.entries import common_problems, read_entries
from denpex.core.events import SEVERITIES, Event, Evidence
from denpex.core.taxonomy import Taxonomy, load_taxonomy

CATALOG_FILE = "detectors.yaml"
REQUIRED_KEYS = ("id", "category", "severity", "action", "summary", "explain", "refs")
# `varies`: what decides severity or action per evidence (the reading, a site's table);
# only a detector that says so may be given another severity or action than its own
OPTIONAL_KEYS = ("varies",)


class DetectorCatalogError(Exception):
    """The detector catalog has problems; `errors` lists each as 'file:line: message'."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__(
            f"{len(errors)} problem(s) in the detector catalog:\n" + "\n".join(errors[:50])
        )


class UnknownDetector(LookupError):
    """Evidence was asked for with an id the detector catalog does not hold."""


@dataclass(frozen=True, slots=True)
class Detector:
    """One catalog entry. `severity` and `action` are what evidence of it carries unless
    `varies` says the reading decides (then they are the usual or the worst case)."""

    id: str
    category: str
    severity: str
    action: str
    summary: str  # a str.format template over the evidence's captures and values
    explain: str
    refs: tuple[str, ...]
    varies: str = ""
    file: str = CATALOG_FILE
    line: int = 0

    def render(self, values: Mapping[str, Any]) -> str:
        """The summary of one evidence; a field the caller did not give is a bug: raises."""
        try:
            return self.summary.format_map(values)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"detector {self.id}: cannot render its summary: {exc!r}") from exc


def template_fields(template: str) -> list[str]:
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError:
        return [""]


def parse_detectors(text: str, name: str, taxonomy: Taxonomy) -> tuple[list[Detector], list[str]]:
    """The valid entries of a detector file's text and every problem, as 'name:line: ...'."""
    entries, errors = read_entries(text, name)
    detectors: list[Detector] = []
    seen: dict[str, int] = {}
    for entry in entries:
        problems: list[tuple[int, str]] = []

        def err(key: str | None, message: str, entry=entry, problems=problems) -> None:
            problems.append((entry.key_lines.get(key or "", entry.line), message))

        data = entry.data
        if not isinstance(data, dict):
            errors.append(f"{name}:{entry.line}: an entry must be a mapping")
            continue
        common_problems(data, err, taxonomy, REQUIRED_KEYS, OPTIONAL_KEYS)
        summary = data.get("summary")
        if isinstance(summary, str) and any(not f.isidentifier() for f in template_fields(summary)):
            err("summary", "summary fields must be names: {gpu}, {count:.0f}")
        if "varies" in data and (not isinstance(data["varies"], str) or not data["varies"]):
            err("varies", "'varies' says what decides the severity or action per evidence")
        detector_id = str(data.get("id"))
        if detector_id in seen:
            err("id", f"duplicate id (first defined at {name}:{seen[detector_id]})")
        seen.setdefault(detector_id, entry.line)
        label = data.get("id", "?")
        errors.extend(f"{name}:{line}: {label}: {message}" for line, message in sorted(problems))
        if problems:
            continue
        detectors.append(
            Detector(
                id=detector_id,
                category=data["category"],
                severity=data["severity"],
                action=data["action"],
                summary=summary if isinstance(summary, str) else "",
                explain=" ".join(data["explain"].split()),
                refs=tuple(data["refs"]),
                varies=" ".join(str(data.get("varies", "")).split()),
                file=name,
                line=entry.line,
            )
        )
    return detectors, errors


@cache
def detector_catalog() -> Mapping[str, Detector]:
    """The shipped detectors by id (in file order); DetectorCatalogError lists every problem."""
    text = resources.files("denpex.core").joinpath(CATALOG_FILE).read_text("utf-8")
    detectors, errors = parse_detectors(text, f"denpex/core/{CATALOG_FILE}", load_taxonomy())
    if errors:
        raise DetectorCatalogError(errors)
    return {d.id: d for d in detectors}


def detector(detector_id: str) -> Detector:
    """The catalog entry of `detector_id`; UnknownDetector when there is none."""
    found = detector_catalog().get(detector_id)
    if found is None:
        raise UnknownDetector(
            f"detector id {detector_id!r} is not in denpex/core/{CATALOG_FILE}: add it there "
            "with its category, severity, action, summary and explanation"
        )
    return found


def detector_evidence(
    event: Event,
    detector_id: str,
    *,
    captures: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
    severity: str | None = None,
    action: str | None = None,
) -> Evidence:
    """Evidence of detector `detector_id` about `event`: category, severity and action from
    the catalog, the summary rendered from its template over `captures` (kept on the
    evidence) and `values` (only for the text: numbers with their format). `severity` and
    `action` replace the catalog's only for a detector whose entry says what `varies`.
    The receiver (agent, wrapper) gives the evidence its id."""
    entry = detector(detector_id)
    if (severity is not None or action is not None) and not entry.varies:
        raise ValueError(
            f"detector {detector_id}: its severity and action are fixed in the catalog "
            "(give the entry a 'varies' line to let the reading decide)"
        )
    if severity is not None and severity not in SEVERITIES:
        raise ValueError(
            f"detector {detector_id}: severity {severity!r} is not one of {SEVERITIES}"
        )
    if action is not None and action not in ACTIONS:
        raise ValueError(f"detector {detector_id}: action {action!r} is not one of {ACTIONS}")
    kept = dict(captures or {})
    return Evidence(
        id="",
        event=event,
        signature=entry.id,
        category=entry.category,
        severity=severity or entry.severity,
        captures=kept,
        summary=entry.render({**kept, **(values or {})}),
        action=action or entry.action,
    )


def detector_summary(
    detector_id: str,
    captures: Mapping[str, str] | None = None,
    values: Mapping[str, Any] | None = None,
) -> str:
    """The summary evidence of `detector_id` would carry: for an event body written before
    the evidence is built."""
    return detector(detector_id).render({**(captures or {}), **(values or {})})
