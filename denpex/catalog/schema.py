"""One signature of the catalog (DESIGN §5) and the checks every entry must pass.

Validation reports every problem of an entry, each with the line it is on; it never stops at
the first, so one run of the loader lists everything a catalog author has to fix.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Any

from denpex._native.linesearch import LineSearch
from denpex._native.literals import IGNORECASE_PREFIX, literal_plan, portability_errors
from denpex.core.entries import common_problems, str_list
from denpex.core.events import SOURCES, Event, Evidence
from denpex.core.taxonomy import Taxonomy

REQUIRED_KEYS = (
    "id",
    "category",
    "severity",
    "regex",
    "summary",
    "action",
    "explain",
    "refs",
    "examples",
)
OPTIONAL_KEYS = ("sources", "flags")
KNOWN_FLAGS = ("ignorecase",)
MIN_LITERAL_BYTES = 3
_INLINE_FLAGS = re.compile(r"\(\?[aiLmsux-]+\)")


@dataclass(slots=True)
class Signature:
    """A validated catalog entry, with its regex compiled for bytes lines."""

    id: str
    category: str
    severity: str
    regex: str
    summary: str
    action: str
    explain: str
    refs: list[str]
    examples_match: list[str]
    examples_no_match: list[str]
    sources: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    file: str = ""
    line: int = 0
    overrides: str | None = None  # the shipped file this site-local entry replaces
    compiled: LineSearch | None = field(default=None, repr=False)

    @property
    def pattern(self) -> str:
        """The regex in the matcher's form: '(?i)' prefixed when case-insensitive."""
        return (IGNORECASE_PREFIX if "ignorecase" in self.flags else "") + self.regex

    def accepts_source(self, source: str) -> bool:
        return not self.sources or source in self.sources

    def captures(self, line: bytes) -> dict[str, str]:
        """Named groups of the match on `line`, decoded; empty when it does not match."""
        assert self.compiled is not None
        groups = self.compiled.groups(line)
        if groups is None:
            return {}
        return {k: v.decode("utf-8", "replace") for k, v in groups.items() if v is not None}

    def render_summary(self, captures: dict[str, str]) -> str:
        return string.Formatter().vformat(self.summary, (), _Missing(captures))

    def evidence(self, event: Event, captures: dict[str, str], evidence_id: str = "") -> Evidence:
        """The evidence this signature's match on `event` is."""
        return Evidence(
            id=evidence_id,
            event=event,
            signature=self.id,
            category=self.category,
            severity=self.severity,
            captures=captures,
            summary=self.render_summary(captures),
            action=self.action,
        )


class _Missing(dict):
    def __missing__(self, key: str) -> str:
        return "?"


def template_fields(template: str) -> list[str]:
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name]
    except ValueError:
        return ["<malformed>"]


def validate_entry(
    data: Any, key_lines: dict[str, int], line: int, taxonomy: Taxonomy
) -> tuple[Signature | None, list[tuple[int, str]]]:
    """(signature or None, [(line, message), ...]) for one YAML entry."""
    errors: list[tuple[int, str]] = []

    def err(key: str | None, message: str) -> None:
        errors.append((key_lines.get(key or "", line), message))

    if not isinstance(data, dict):
        return None, [(line, "an entry must be a mapping")]
    common_problems(data, err, taxonomy, REQUIRED_KEYS, OPTIONAL_KEYS)
    sig_id, category = data.get("id"), data.get("category")
    sources = data.get("sources", [])
    if str_list(sources) is None or any(s not in SOURCES for s in sources):
        err("sources", f"sources must be a list of {', '.join(SOURCES)}")
    flags = data.get("flags", [])
    if str_list(flags) is None or any(f not in KNOWN_FLAGS for f in flags):
        err("flags", f"flags must be a list of {', '.join(KNOWN_FLAGS)}")
    refs = data.get("refs")

    compiled = None
    group_names: set[str] = set()
    regex = data.get("regex")
    if "regex" in data:
        if not isinstance(regex, str) or not regex:
            err("regex", "regex must be a non-empty string")
        else:
            if _INLINE_FLAGS.match(regex):
                err("regex", "regex starts with inline flags: use `flags: [ignorecase]`")
            for problem in portability_errors(regex):
                err("regex", f"regex {problem}")
            pattern = (IGNORECASE_PREFIX if "ignorecase" in (flags or []) else "") + regex
            try:
                compiled = LineSearch(pattern)
                group_names = set(compiled.compiled.groupindex)
            except re.error:
                compiled = None  # already reported by portability_errors
            if compiled is not None:
                plan = literal_plan(pattern, MIN_LITERAL_BYTES)
                if plan is None:
                    err(
                        "regex",
                        f"regex needs a required literal of at least {MIN_LITERAL_BYTES} bytes",
                    )
                elif plan.unbounded_before:
                    err("regex", "regex has an unbounded repeat (.*, \\S+ …) before its literal")
    summary = data.get("summary")
    if isinstance(summary, str) and compiled is not None:
        for name in template_fields(summary):
            if name not in group_names:
                err("summary", f"summary uses {{{name}}} but the regex has no group of that name")

    examples = data.get("examples")
    match: list[str] | None = None
    no_match: list[str] | None = None
    if "examples" in data:
        if not isinstance(examples, dict):
            err("examples", "examples must map 'match' and 'no_match' to lists of lines")
        else:
            match = str_list(examples.get("match"))
            no_match = str_list(examples.get("no_match"))
            if not match:
                err("examples", "examples.match needs at least one line")
            if not no_match:
                err("examples", "examples.no_match needs at least one line")
            extra = set(examples) - {"match", "no_match"}
            if extra:
                err("examples", f"unknown example keys: {', '.join(sorted(extra))}")

    if errors:
        return None, errors
    signature = Signature(
        id=str(sig_id),
        category=str(category),
        severity=data["severity"],
        regex=str(regex),
        summary=str(summary),
        action=data["action"],
        explain=data["explain"].strip(),
        refs=list(refs or []),
        examples_match=list(match or []),
        examples_no_match=list(no_match or []),
        sources=tuple(sources),
        flags=tuple(flags),
        line=line,
        compiled=compiled,
    )
    return signature, []
