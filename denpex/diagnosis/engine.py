"""The diagnosis engine: evidence in, one deterministic Diagnosis out (DESIGN §6).

Same evidence and exit status → same diagnosis, byte for byte. Used by `denpex run/scan`,
the agent and the control plane alike; it never reads files or the clock.
"""

from __future__ import annotations

import signal as signal_module
from collections.abc import Mapping
from dataclasses import dataclass, field

from denpex.core.diagnosis import Action, Contributing, Diagnosis, RootCause, TimelineEntry
from denpex.core.events import Evidence, format_ts, severity_rank
from denpex.core.taxonomy import Taxonomy, load_taxonomy
from denpex.diagnosis.config import RulesConfig, load_rules
from denpex.diagnosis.rules import (
    RULES,
    Finding,
    RuleContext,
    cause_explains_effect,
    part_of_root_traceback,
)
from denpex.diagnosis.summary import action_reason, summarize
from denpex.diagnosis.timeline import before, ordered, pick_timeline, seconds_between

_MAX_IDS = 20


@dataclass(slots=True)
class DiagnosisInput:
    """Everything one diagnosis is computed from."""

    evidence: list[Evidence]
    exit_code: int | None = None
    exit_signal: int | None = None
    stats: dict[str, int] = field(default_factory=dict)
    explanations: Mapping[str, str] = field(default_factory=dict)  # signature id → explain
    notes: list[str] = field(default_factory=list)


def signal_name(number: int | None) -> str | None:
    if number is None:
        return None
    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"SIG{number}"


def _confidence(ctx: RuleContext, finding: Finding, cfg: RulesConfig, dropped: int) -> float:
    root = finding.root
    value = cfg.base_confidence(finding.rule)
    same = [e for e in ctx.evidence if e.category == root.category]
    if len(same) >= 2:
        value += cfg.adjustment("corroborated_count")
    if len({e.event.source for e in same}) >= 2:
        value += cfg.adjustment("corroborated_sources")
    if finding.note == "sigkill":
        value += cfg.adjustment("sigkill_matches")
    if root.event.attrs.get("userspace"):
        value += cfg.adjustment("userspace_kmsg")
    if dropped:
        value += cfg.adjustment("dropped_analysis")
    if finding.rule in ("first_failing_rank", "first_failing_weak"):
        window = float(cfg["competing_window_s"])
        for other in ctx.failures:
            if other.category == root.category or ctx.tier(other.category) != "specific":
                continue
            if (other.event.host, other.event.rank) == (root.event.host, root.event.rank):
                continue
            gap = seconds_between(root, other)
            if gap is not None and abs(gap) <= window:
                value += cfg.adjustment("competing_cause")
                break
    conf = cfg.raw["confidence"]
    return round(min(float(conf["max"]), max(float(conf["min"]), value)), 2)


def _role(ctx: RuleContext, item: Evidence, root: Evidence) -> str:
    if not item.is_failure:
        return "observed"
    if part_of_root_traceback(item, root, int(ctx.config["traceback_lines"])):
        return "related"
    if ctx.tier(item.category) != "specific" or before(root, item):
        return "symptom"
    return "related"


def _contributing(ctx: RuleContext, root: Evidence | None) -> list[Contributing]:
    groups: dict[tuple[str, str, str], Contributing] = {}
    for item in ctx.evidence:
        if root is not None and item.category == root.category:
            continue
        if not item.is_failure and severity_rank(item.severity) < 1:
            continue  # info lines are evidence, not contributions
        role = _role(ctx, item, root) if root is not None else "observed"
        key = (item.category, item.signature, role)
        group = groups.get(key)
        if group is None:
            groups[key] = Contributing(
                category=item.category,
                signature=item.signature,
                role=role,
                evidence=[item.id],
                host=item.event.host,
                rank=item.event.rank,
            )
            continue
        group.count += 1
        if len(group.evidence) < _MAX_IDS:
            group.evidence.append(item.id)
        if group.host != item.event.host:
            group.host = None
        if group.rank != item.event.rank:
            group.rank = None
    return list(groups.values())


def _timeline_entries(items: list[Evidence], roles: dict[str, str]) -> list[TimelineEntry]:
    return [
        TimelineEntry(
            id=e.id,
            ts=format_ts(e.event.ts_ns),
            host=e.event.host,
            rank=e.event.rank,
            source=e.event.source,
            signature=e.signature,
            category=e.category,
            line=e.event.body[:2000],
            role=roles.get(e.id, "related"),
            severity=e.severity,
            attribution=_attribution(e),
        )
        for e in items
    ]


def _attribution(e: Evidence) -> str | None:
    value = e.event.attrs.get("attribution")
    return value if isinstance(value, str) else None


def _actions(root: Evidence, cfg: RulesConfig, explanations: Mapping[str, str]) -> list[Action]:
    names = [root.action, *cfg.followups(root.category)]
    actions: list[Action] = []
    for name in dict.fromkeys(n for n in names if n and n != "none"):
        target = root.event.host
        if (
            name in ("reduce_memory", "fix_code", "check_data", "fix_config")
            and root.event.rank is not None
        ):
            target = f"rank {root.event.rank}" + (
                f" on {root.event.host}" if root.event.host else ""
            )
        actions.append(Action(name, target, action_reason(name, root, explanations)))
    return actions


def diagnose(
    data: DiagnosisInput, *, config: RulesConfig | None = None, taxonomy: Taxonomy | None = None
) -> Diagnosis:
    """The root cause of `data.evidence`, with its evidence chain, summary and actions."""
    cfg = config or load_rules()
    taxonomy = taxonomy or load_taxonomy()
    exit_signal = signal_name(data.exit_signal)
    ctx = RuleContext(list(data.evidence), data.exit_code, exit_signal, cfg)
    diagnosis = Diagnosis(
        exit_code=data.exit_code,
        exit_signal=exit_signal,
        stats=dict(data.stats),
        notes=list(data.notes),
    )
    dropped = int(data.stats.get("dropped_analysis_bytes", 0))
    job_failed = (data.exit_code not in (None, 0)) or data.exit_signal is not None

    finding: Finding | None = None
    if data.exit_code != 0:  # rule noise_is_not_failure: a run that exited 0 has no cause
        for rule in RULES:
            finding = rule(ctx)
            if finding is not None:
                finding = cause_explains_effect(ctx, finding)
                break

    if finding is None:
        diagnosis.status = "failed" if job_failed else "ok"
        diagnosis.root_cause = RootCause(
            rule="no_evidence" if data.exit_code != 0 else "noise_is_not_failure",
            title=taxonomy["unknown"].title,
        )
        diagnosis.contributing = _contributing(ctx, None)
        observed = ordered([e for e in ctx.evidence if severity_rank(e.severity) >= 1])
        picked = observed[: int(cfg["timeline_max"])]
        diagnosis.timeline = _timeline_entries(picked, {e.id: "observed" for e in picked})
        diagnosis.summary = summarize(diagnosis, None, ctx, taxonomy)
        return diagnosis

    root = finding.root
    root_items = [e for e in ctx.evidence if e.category == root.category]
    traceback_lines = int(cfg["traceback_lines"])
    others = [
        e
        for e in ctx.failures
        if e.category != root.category and not part_of_root_traceback(e, root, traceback_lines)
    ]
    picked = pick_timeline(
        [root, *[e for e in root_items if e is not root]],
        others,
        max_lines=int(cfg["timeline_max"]),
        root_lines=int(cfg["timeline_root_lines"]),
    )
    roles = {
        e.id: ("cause" if e.category == root.category else _role(ctx, e, root)) for e in picked
    }
    diagnosis.status = "failed"
    diagnosis.root_cause = RootCause(
        category=root.category,
        signature=root.signature,
        confidence=_confidence(ctx, finding, cfg, dropped),
        host=root.event.host,
        rank=root.event.rank,
        evidence=[e.id for e in ordered(root_items)][:_MAX_IDS],
        explanation=data.explanations.get(root.signature, root.summary),
        rule=finding.rule,
        title=taxonomy[root.category].title if root.category in taxonomy else root.category,
    )
    diagnosis.contributing = _contributing(ctx, root)
    diagnosis.timeline = _timeline_entries(picked, roles)
    diagnosis.actions = _actions(root, cfg, data.explanations)
    diagnosis.summary = summarize(diagnosis, root, ctx, taxonomy)
    return diagnosis
