"""Causal chains of one diagnosis: the root named more exactly (its own line read another
way, the traceback frame it was raised in), the deeper cause of a root (rule
cause_explains_effect), what a cause accounts for, and the independent failures it does not
(further findings).

Every edge comes from rules.yaml `explains` and `refines`; a failure is never merged into a
cause that cannot explain it. Pure functions over a RuleContext; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from denpex.core.events import Evidence, severity_rank
from denpex.diagnosis.context import (
    Finding,
    RuleContext,
    part_of_root_traceback,
    same_line,
    strongest_earliest,
)
from denpex.diagnosis.timeline import before, earliest, line_key

Rule = Callable[[RuleContext], Finding | None]


def _innermost_frame(ctx: RuleContext, root: Evidence) -> Evidence | None:
    """The frame signature nearest above `root` in its own traceback: same stream and rank,
    at most rules.yaml `traceback_lines` above it, and no other failure line between them
    (that would end an earlier traceback)."""
    cfg = ctx.config
    limit = int(cfg["traceback_lines"])
    here = (root.event.attrs.get("stream"), root.event.host, root.event.rank)
    frame = None
    for item in ctx.evidence:
        gap = root.event.seq - item.event.seq
        if (item.event.attrs.get("stream"), item.event.host, item.event.rank) != here:
            continue
        if not 0 < gap <= limit:
            continue
        if cfg.is_frame_signature(item.signature):
            if frame is None or item.event.seq > frame.event.seq:
                frame = item
        elif item.is_failure and frame is not None and item.event.seq > frame.event.seq:
            frame = None  # a failure below the frame ended that traceback
    return frame


def _detail(ctx: RuleContext, root: Evidence) -> Evidence | None:
    """The first line of the root's own message below it (same stream and rank, at most
    rules.yaml `refines.detail_lines` lines down) that names it more exactly: NCCL's reason
    after "Last error:"."""
    cfg = ctx.config
    reach = int(cfg["refines"]["detail_lines"])
    here = (root.event.attrs.get("stream"), root.event.host, root.event.rank)
    below = [
        e
        for e in ctx.failures
        if (e.event.attrs.get("stream"), e.event.host, e.event.rank) == here
        and 0 < e.event.seq - root.event.seq <= reach
        and cfg.details(e.category, root.category)
    ]
    return min(below, key=lambda e: e.event.seq, default=None)


def refined(ctx: RuleContext, finding: Finding) -> Finding:
    """The root named more exactly (rules.yaml `refines`): another reading of its own line
    (ENOSPC on /dev/shm is shared memory running out), else the reason its message gives on
    the lines below it (NCCL's "Last error:"), else the innermost frame of its traceback that
    says what the program was doing (a bare exception raised inside torch.save is a checkpoint
    save that failed): the root's line, under the frame's signature."""
    cfg, root = ctx.config, finding.root
    if finding.derived:
        return finding
    better = [
        e
        for e in ctx.failures
        if same_line(e, root) and e is not root and cfg.refines(e.category, root.category)
    ]
    if better:
        return Finding(finding.rule, max(better, key=lambda e: severity_rank(e.severity)))
    detail = _detail(ctx, root)
    if detail is not None:
        return Finding(finding.rule, detail)
    frame = _innermost_frame(ctx, root)
    if frame is None or not cfg.refines(frame.category, root.category):
        return finding
    ids = [int(e.id[1:]) for e in ctx.evidence if e.id[1:].isdigit()]
    named = Evidence(
        id=f"e{max(ids, default=0) + 1}",
        event=root.event,  # the same line: one timeline row, the exception's own place
        signature=frame.signature,
        category=frame.category,
        severity=root.severity,
        captures={**root.captures, **frame.captures},
        summary=f"{frame.summary}: {root.event.body.strip()[:200]}",
        action=frame.action,
    )
    assert line_key(named) == line_key(root)
    return Finding("named_by_frame", named, derived=True)


def cause_explains_effect(ctx: RuleContext, finding: Finding) -> Finding:
    """Refines a finding: evidence whose category explains the root's (rules.yaml `explains`:
    a full disk explains a failed checkpoint save) and that sits near it is the deeper cause.
    Where two categories explain each other, the earlier evidence is the cause."""
    visited = {finding.root.category}
    for _ in range(3):  # short chains: a link down → IB errors → NCCL system error
        root = finding.root
        first = earliest([e for e in ctx.evidence if e.category == root.category]) or root
        causes = [
            e
            for e in ctx.evidence
            if severity_rank(e.severity) >= 1
            and e.category not in visited
            and not same_line(e, root)  # one line read two ways is one statement, not a cause
            and ctx.explains(e, root)
            and not (ctx.explains(root, e) and before(first, e))
            # a symptom (a timeout) is never a deeper cause: what it explains is the teardown
            # it starts (rules.yaml `explains` of nccl.timeout), not the failure before it
            and ctx.tier(e.category) != "symptom"
        ]
        cause = strongest_earliest(causes)
        if cause is None:
            break
        visited.add(cause.category)
        finding = Finding("cause_explains_effect", cause)
    return finding


def _absorbed(ctx: RuleContext, root: Evidence, item: Evidence) -> bool:
    """Failures every cause accounts for: its own category and line, its traceback, symptoms
    and generic errors, and the scheduler's ending of a job that had already failed."""
    cfg = ctx.config
    if item.category == root.category or same_line(item, root):
        return True
    if ctx.tier(item.category) != "specific":
        return True
    if part_of_root_traceback(item, root, int(cfg["traceback_lines"])):
        return True
    after = not before(item, root)
    return after and (cfg.is_scheduler(item.category) or cfg.is_scheduler(root.category))


def accounted_for(ctx: RuleContext, root: Evidence) -> list[Evidence]:
    """The failures `root` explains, directly or through a chain of `explains` edges (a link
    down → IB errors → NCCL errors); `root` first."""
    chain = [root]
    # an item is only compared with the chain's members of categories that have an `explains`
    # edge to its own (most pairs have none), and with each member once: `checked` is how many
    # of each category's members it has been compared with in earlier passes
    by_category = {root.category: [root]}
    pending = [_Pending(e, _absorbed(ctx, root, e)) for e in ctx.failures if e is not root]
    grew = True
    while grew:
        grew = False
        for entry in pending:
            if entry.in_chain:
                continue
            if entry.absorbed or _explained(ctx, by_category, entry):
                chain.append(entry.item)
                by_category.setdefault(entry.item.category, []).append(entry.item)
                entry.in_chain = grew = True
    return chain


@dataclass(slots=True)
class _Pending:
    item: Evidence
    absorbed: bool
    in_chain: bool = False
    checked: dict[str, int] = field(default_factory=dict)


def _explained(ctx: RuleContext, by_category: dict[str, list[Evidence]], entry: _Pending) -> bool:
    item, checked = entry.item, entry.checked
    for category, members in by_category.items():
        if not ctx.config.explains(category, item.category):
            continue
        start = checked.get(category, 0)
        checked[category] = len(members)
        if any(ctx.explains(cause, item) for cause in members[start:]):
            return True
    return False


def further_findings(
    ctx: RuleContext, root: Evidence, rules: tuple[Rule, ...]
) -> list[tuple[Finding, list[Evidence]]]:
    """Independent failures: specific failures no earlier cause explains, each named by the
    first rule of `rules` (among rules.yaml `finding_rules`) that fires on what is left, with
    the failures it accounts for. Earliest first; at most rules.yaml `findings_max`."""
    cfg = ctx.config
    allowed = set(cfg["finding_rules"])
    explained = {id(e) for e in accounted_for(ctx, root)}
    found: list[tuple[Finding, list[Evidence]]] = []
    for _ in range(int(cfg["findings_max"])):
        left = [e for e in ctx.failures if id(e) not in explained]
        if not left:
            break
        quiet = [e for e in ctx.evidence if not e.is_failure and e.category != root.category]
        rest = ctx.subset([*left, *quiet])
        finding = None
        for rule in rules:
            finding = rule(rest)
            if finding is not None:
                break
        if finding is None or finding.rule not in allowed:
            break
        explained.add(id(finding.root))
        finding = cause_explains_effect(rest, refined(rest, finding))
        chain = accounted_for(rest, finding.root)
        found.append((finding, chain))
        explained.update(id(e) for e in chain)
        explained.add(id(finding.root))
    return found
