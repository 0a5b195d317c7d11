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
from denpex.diagnosis.causality import (
    accounted_for,
    cause_explains_effect,
    further_findings,
    refined,
)
from denpex.diagnosis.config import RulesConfig, load_rules
from denpex.diagnosis.context import (
    Finding,
    RuleContext,
    is_host_context,
    part_of_root_traceback,
)
from denpex.diagnosis.rules import RULES, integrity_on_success
from denpex.diagnosis.summary import Story, action_reason, coverage_note, summarize
from denpex.diagnosis.timeline import before, line_key, ordered, pick_timeline, seconds_between

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
    coverage_lost: list[dict] = field(default_factory=list)  # Scanner.coverage_lost


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
    if finding.note == "progress_numbers":
        value += cfg.adjustment("progress_numbers")
    if finding.note == "host_context":
        value += cfg.adjustment("host_context_only")
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


def _first_finding(ctx: RuleContext) -> Finding | None:
    """The first rule that fires, refined by the causal edges; on a run that exited 0, only
    evidence that its results are wrong can fail it (rule noise_is_not_failure)."""
    if ctx.exit_code == 0:
        return integrity_on_success(ctx)
    for rule in RULES:
        finding = rule(ctx)
        if finding is not None:
            return cause_explains_effect(ctx, refined(ctx, finding))
    return None


def _choose(ctx: RuleContext, job: RuleContext) -> Finding | None:
    """The job's own finding, unless host context is a better lead than anything the job
    shows (rules.yaml `host_context`); then that, marked as host context."""
    finding = _first_finding(job)
    leads_after = ctx.config["host_context"]["leads_after"]
    if ctx.exit_code == 0 or len(job.evidence) == len(ctx.evidence):
        return finding
    if finding is not None and finding.rule not in leads_after:
        return finding
    wider = _first_finding(ctx)
    if wider is not None and is_host_context(wider.root):
        return Finding(wider.rule, wider.root, note="host_context", derived=wider.derived)
    return finding


class _Roles:
    """The role of every piece of evidence in one diagnosis."""

    def __init__(
        self,
        ctx: RuleContext,
        root: Evidence,
        chain: list[Evidence],
        findings: list[tuple[Finding, list[Evidence]]],
    ) -> None:
        self.ctx, self.root = ctx, root
        self.root_lines = {line_key(e) for e in ctx.evidence if e.category == root.category}
        self.root_lines.add(line_key(root))
        self.chain = {id(e) for e in chain}
        self.found: dict[int, str] = {}
        for finding, accounted in findings:
            for item in accounted:
                own = item.category == finding.root.category
                self.found.setdefault(id(item), "finding" if own else "symptom")
            self.found[id(finding.root)] = "finding"

    def of(self, item: Evidence) -> str:
        ctx, root = self.ctx, self.root
        if is_host_context(item) and item is not root:
            return "context"
        if item.category == root.category or line_key(item) in self.root_lines:
            return "cause"
        if id(item) in self.found:
            return self.found[id(item)]
        if not item.is_failure:
            return "observed"
        if part_of_root_traceback(item, root, int(ctx.config["traceback_lines"])):
            return "related"
        if id(item) in self.chain and (ctx.tier(item.category) != "specific" or before(root, item)):
            return "symptom"
        return "related"


def _contributing(
    ctx: RuleContext, root: Evidence | None, roles: _Roles | None
) -> list[Contributing]:
    groups: dict[tuple[str, str, str], Contributing] = {}
    for item in ctx.evidence:
        if root is not None and item.category == root.category:
            continue
        context = is_host_context(item)
        if not item.is_failure and severity_rank(item.severity) < 1 and not context:
            continue  # info lines are evidence, not contributions
        if roles is not None:
            role = roles.of(item)
            role = "related" if role == "cause" else role  # matched on the cause's own line
        else:
            role = "context" if context else "observed"
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


def _int_attr(item: Evidence, key: str) -> int | None:
    value = item.event.attrs.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str_attr(item: Evidence, key: str) -> str | None:
    value = item.event.attrs.get(key)
    return value if isinstance(value, str) and value else None


def _timeline_entries(items: list[Evidence], role_of) -> list[TimelineEntry]:
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
            role=role_of(e),
            severity=e.severity,
            attribution=_attribution(e),
            file=_str_attr(e, "file"),
            lineno=_int_attr(e, "line"),
            frame=_str_attr(e, "frame"),
        )
        for e in items
    ]


def _attribution(e: Evidence) -> str | None:
    value = e.event.attrs.get("attribution")
    return value if isinstance(value, str) else None


def _actions(
    root: Evidence, cause: RootCause, cfg: RulesConfig, explanations: Mapping[str, str]
) -> list[Action]:
    names = [root.action, *cfg.followups(root.category)]
    actions: list[Action] = []
    for name in dict.fromkeys(n for n in names if n and n != "none"):
        target = cause.host
        if (
            name in ("reduce_memory", "fix_code", "check_data", "fix_config")
            and cause.rank is not None
        ):
            target = f"rank {cause.rank}" + (f" on {cause.host}" if cause.host else "")
        actions.append(Action(name, target, action_reason(name, root, explanations)))
    return actions


def _frame(items: list[Evidence]) -> str | None:
    """The innermost traceback frame among the cause's lines (the first that has one)."""
    return next((f for f in (_str_attr(e, "frame") for e in items) if f), None)


def _place(
    ctx: RuleContext, root: Evidence, chain: list[Evidence]
) -> tuple[str | None, int | None]:
    """Host and rank of a cause whose own line names no rank: the one rank the rest of its
    incident names (the OOM report's victim line after its "invoked oom-killer" line), else,
    for hardware, the one rank on its host whose specific failures it explains."""
    host, rank = root.event.host, root.event.rank
    if rank is not None:
        return host, rank
    cfg = ctx.config

    def near(item: Evidence) -> bool:
        gap = seconds_between(root, item)
        if gap is not None:
            return abs(gap) <= float(cfg["explains_window_s"])
        return abs(item.event.seq - root.event.seq) <= int(cfg["explains_lines"])

    def beside(item: Evidence) -> bool:
        return item.event.rank is not None and (host is None or item.event.host in (None, host))

    kin = is_host_context(root)  # host context speaks for the job only when the cause is
    own = [
        e
        for e in ctx.evidence
        if e.category == root.category and beside(e) and near(e) and (kin or not is_host_context(e))
    ]
    if not own and cfg.is_infrastructure(root.category):
        own = [
            e
            for e in chain
            if e is not root and ctx.tier(e.category) == "specific" and beside(e) and near(e)
        ]
    if len({e.event.rank for e in own}) != 1:
        return host, None
    return host or own[0].event.host, own[0].event.rank


def _cause(
    ctx: RuleContext,
    finding: Finding,
    cfg: RulesConfig,
    data: DiagnosisInput,
    taxonomy: Taxonomy,
    dropped: int,
    chain: list[Evidence] | None = None,
) -> RootCause:
    root = finding.root
    host, rank = _place(ctx, root, chain or [root])
    context = is_host_context(root)  # a host-context cause keeps its kin; a job's cause not
    # the cause's own line first (where the report says it is), then its other lines in order
    items = [
        root,
        *ordered(
            [
                e
                for e in ctx.evidence
                if e.category == root.category
                and e is not root
                and (context or not is_host_context(e))
            ]
        ),
    ]
    attribution = root.event.attrs.get("attribution")
    explanation = data.explanations.get(root.signature)
    return RootCause(
        category=root.category,
        signature=root.signature,
        confidence=_confidence(ctx, finding, cfg, dropped),
        host=host,
        rank=rank,
        evidence=[e.id for e in items][:_MAX_IDS],
        explanation=explanation or root.summary,
        rule=finding.rule,
        title=taxonomy[root.category].title if root.category in taxonomy else root.category,
        attribution=attribution if attribution in ("job", "host") else None,
        frame=_frame(items),
    )


def diagnose(
    data: DiagnosisInput, *, config: RulesConfig | None = None, taxonomy: Taxonomy | None = None
) -> Diagnosis:
    """The root cause of `data.evidence`, with its evidence chain, summary and actions."""
    cfg = config or load_rules()
    taxonomy = taxonomy or load_taxonomy()
    exit_signal = signal_name(data.exit_signal)
    ctx = RuleContext(list(data.evidence), data.exit_code, exit_signal, cfg)
    job = ctx.subset([e for e in ctx.evidence if not is_host_context(e)])
    context = [e for e in ctx.evidence if is_host_context(e)]
    diagnosis = Diagnosis(
        exit_code=data.exit_code,
        exit_signal=exit_signal,
        stats=dict(data.stats),
        notes=[*data.notes, *map(coverage_note, data.coverage_lost)],
        coverage_lost=[dict(c) for c in data.coverage_lost],
    )
    dropped = int(data.stats.get("dropped_analysis_bytes", 0))
    job_failed = (data.exit_code not in (None, 0)) or data.exit_signal is not None

    finding = _choose(ctx, job)
    if finding is None:
        diagnosis.status = "failed" if job_failed else "ok"
        diagnosis.root_cause = RootCause(
            rule="no_evidence" if data.exit_code != 0 else "noise_is_not_failure",
            title=taxonomy["unknown"].title,
        )
        diagnosis.contributing = _contributing(ctx, None, None)
        observed = ordered([e for e in ctx.evidence if severity_rank(e.severity) >= 1])
        picked = observed[: int(cfg["timeline_max"])]
        diagnosis.timeline = _timeline_entries(
            picked, lambda e: "context" if is_host_context(e) else "observed"
        )
        diagnosis.summary = summarize(diagnosis, Story(ctx, None, [], context, []), taxonomy)
        return diagnosis

    root = finding.root
    if finding.derived:  # a rank named from other ranks' evidence joins the timeline
        ctx = ctx.subset([*ctx.evidence, root])
        job = job.subset([*job.evidence, root])
    on = ctx if finding.note == "host_context" else job
    chain = accounted_for(on, root)
    findings = [] if data.exit_code == 0 else further_findings(job, root, RULES)
    roles = _Roles(ctx, root, chain, findings)
    # the cause's own lines; host context of the same category is shown as context
    root_items = [
        e
        for e in ctx.evidence
        if e.category == root.category and (e is root or not is_host_context(e))
    ]
    traceback_lines = int(cfg["traceback_lines"])
    root_lines = {line_key(e) for e in root_items}
    others = [
        e
        for e in ctx.failures
        if e.category != root.category
        and line_key(e) not in root_lines
        and not part_of_root_traceback(e, root, traceback_lines)
    ]
    shown_context = list({e.category: e for e in reversed(context) if e is not root}.values())
    picked = pick_timeline(
        [root, *[e for e in root_items if e is not root]],
        others,
        max_lines=int(cfg["timeline_max"]),
        root_lines=int(cfg["timeline_root_lines"]),
        must=[f.root for f, _ in findings] + shown_context[:2],
    )
    diagnosis.status = "failed"
    diagnosis.root_cause = _cause(ctx, finding, cfg, data, taxonomy, dropped, chain)
    diagnosis.findings = [_cause(job, f, cfg, data, taxonomy, dropped, c) for f, c in findings]
    diagnosis.contributing = _contributing(ctx, root, roles)
    diagnosis.timeline = _timeline_entries(picked, roles.of)
    diagnosis.actions = _actions(root, diagnosis.root_cause, cfg, data.explanations)
    story = Story(
        ctx, root, chain, [e for e in context if e is not root], [f.root for f, _ in findings]
    )
    diagnosis.summary = summarize(diagnosis, story, taxonomy)
    return diagnosis
