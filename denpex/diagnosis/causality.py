"""Causal chains of one diagnosis: the deeper cause of a root (rule cause_explains_effect),
what a cause accounts for, and the independent failures it does not (further findings).

Every edge comes from rules.yaml `explains`; a failure is never merged into a cause that
cannot explain it. Pure functions over a RuleContext; no I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from denpex.core.events import Evidence, severity_rank
from denpex.diagnosis.context import (
    Finding,
    RuleContext,
    part_of_root_traceback,
    same_line,
    strongest_earliest,
)
from denpex.diagnosis.timeline import before, earliest

Rule = Callable[[RuleContext], Finding | None]


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
    seen = {id(root)}
    pending = [e for e in ctx.failures if e is not root]
    grew = True
    while grew:
        grew = False
        for item in pending:
            if id(item) in seen:
                continue
            if _absorbed(ctx, root, item) or any(ctx.explains(c, item) for c in chain):
                chain.append(item)
                seen.add(id(item))
                grew = True
    return chain


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
        finding = cause_explains_effect(rest, finding)
        chain = accounted_for(rest, finding.root)
        found.append((finding, chain))
        explained.update(id(e) for e in chain)
        explained.add(id(finding.root))
    return found
