"""Deterministic text for a diagnosis: the summary paragraph and each action's reason.

Built only from the diagnosis and its evidence (no model, no clock), so the same evidence
always reads the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from denpex.core.diagnosis import Diagnosis
from denpex.core.events import Evidence, format_ts
from denpex.core.taxonomy import Taxonomy
from denpex.diagnosis.timeline import before, line_key

if TYPE_CHECKING:
    from denpex.diagnosis.context import RuleContext

ACTION_TEXT = {
    "retry_job": "restart the job (from its last checkpoint) once the cause is cleared",
    "fix_code": "fix the code path named in the evidence",
    "fix_config": "correct the configuration or launch arguments",
    "reduce_memory": "lower memory use (smaller micro-batch, activation checkpointing, sharding)",
    "check_data": "find and remove or repair the bad input",
    "drain_node": "drain the node so the scheduler stops placing jobs on it",
    "reset_gpu": "reset the GPU (or reboot the node) before reuse",
    "run_diagnostics": "run GPU diagnostics (DCGM level 3) before returning the node to service",
    "check_fabric": "check the network fabric: port counters, cables, switch logs",
    "rma": "open a hardware return (RMA) for the part",
}


@dataclass(slots=True)
class Story:
    """What the summary tells: the cause, what it accounts for, the host context around the
    job and the independent failures found besides it."""

    ctx: RuleContext
    root: Evidence | None
    chain: list[Evidence]  # the failures the root accounts for, the root first
    context: list[Evidence]  # host context (attribution "host"), not the root
    findings: list[Evidence]  # roots of further, independent failures


def where(item: Evidence, host: str | None = None, rank: int | None = None) -> str:
    """`rank 3 on node7`, from the evidence or from the place a diagnosis gave it."""
    rank = item.event.rank if rank is None else rank
    host = host or item.event.host
    parts = []
    if rank is not None:
        parts.append(f"rank {rank}")
    if host:
        parts.append(f"on {host}" if parts else f"host {host}")
    return " ".join(parts)


def _clock(item: Evidence) -> str:
    stamp = format_ts(item.event.ts_ns)
    return f"{stamp[11:19]} UTC" if stamp else ""


def _when(item: Evidence) -> str:
    """`at 12:21:08 UTC`; `after …` when the line has no time of its own and took the time of a
    line before it (a lower bound, not when it happened)."""
    clock = _clock(item)
    if not clock:
        return ""
    return f"after {clock}" if item.event.attrs.get("ts_inherited") else f"at {clock}"


def _ranks_text(ranks: list[int]) -> str:
    ranks = sorted(set(ranks))
    if not ranks:
        return ""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}–{ranks[-1]}"
    shown = ", ".join(map(str, ranks[:8])) + (" …" if len(ranks) > 8 else "")
    return f"rank {shown}" if len(ranks) == 1 else f"ranks {shown}"


def _exit_text(diagnosis: Diagnosis) -> str:
    if diagnosis.exit_signal:
        return f"The job was killed by {diagnosis.exit_signal}."
    if diagnosis.exit_code is not None:
        return f"The job exited with code {diagnosis.exit_code}."
    return ""


def _headline(
    item: Evidence, taxonomy: Taxonomy, host: str | None = None, rank: int | None = None
) -> str:
    """`<what> (<where> at <time>)` of one piece of evidence, without a final stop."""
    title = item.summary or (taxonomy[item.category].title if item.category in taxonomy else "")
    inside = " ".join(part for part in (where(item, host, rank), _when(item)) if part)
    return f"{title} ({inside})" if inside else title


def context_text(context: list[Evidence]) -> str:
    """One sentence per kind of host context: what, when, and that it is not this job's."""
    sentences = []
    for item in list({e.category: e for e in reversed(context)}.values())[::-1][:3]:
        when = f" {_when(item)}" if _when(item) else ""
        reason = item.event.attrs.get("attribution_reason")
        why = f" ({reason})" if isinstance(reason, str) and reason else ""
        sentences.append(
            f"Host context: {item.summary or item.category}{when}{why} — not this job."
        )
    return " ".join(sentences)


def later_lines(story: Story) -> list[Evidence]:
    """The failure lines after the cause that it accounts for: one per line, the cause's own
    lines (its category, the line it matched on) left out."""
    root = story.root
    if root is None:
        return []
    own = {line_key(e) for e in story.ctx.evidence if e.category == root.category}
    own.add(line_key(root))
    kept: dict[tuple[object, ...], Evidence] = {}
    for item in story.chain:
        if item is root or item.category == root.category or not before(root, item):
            continue
        key = line_key(item)
        if key not in own:
            kept.setdefault(key, item)
    return list(kept.values())


def coverage_note(lost: Mapping[str, object]) -> str:
    """`checksums off since step 5 on rank 2: Numpy is not available`."""
    since = lost.get("since_step")
    rank = lost.get("rank")
    return (
        f"{lost.get('check') or 'an SDK check'} off"
        + (f" since step {since}" if isinstance(since, int) else "")
        + (f" on rank {rank}" if isinstance(rank, int) else "")
        + (f": {lost['reason']}" if lost.get("reason") else "")
    )


def summarize(diagnosis: Diagnosis, story: Story, taxonomy: Taxonomy) -> str:
    exit_text = _exit_text(diagnosis)
    root, ctx = story.root, story.ctx
    around = context_text(story.context)
    if root is None:
        warnings = [e for e in ctx.evidence if not e.is_failure and e.severity != "info"]
        failures = ctx.failures
        if diagnosis.status == "ok":
            text = "No failure found."
            if diagnosis.coverage_lost:
                text = (
                    "No failure found, but the run was not fully checked: "
                    + "; ".join(map(coverage_note, diagnosis.coverage_lost))
                    + "."
                )
            if failures or warnings:
                text += (
                    f" {len(failures) + len(warnings)} warning or error line(s) were seen, "
                    "but the run ended normally."
                )
            return " ".join(p for p in (text, around, exit_text) if p)
        return " ".join(
            p
            for p in (
                "The job failed, but no line of its output matched a known failure signature.",
                exit_text,
                "Check the last lines of the output; if this failure repeats, add a signature "
                "for it.",
                around,
            )
            if p
        )

    cause = diagnosis.root_cause
    text = _headline(root, taxonomy, cause.host, cause.rank) + "."
    if diagnosis.root_cause.rule == "warnings_on_failure":
        text = f"No error line matched; the strongest lead is a warning: {text}"
    if diagnosis.root_cause.attribution == "host":
        text = (
            "The job's own output names no cause; the only lead is host evidence not tied to "
            f"this job: {text}"
        )
    if diagnosis.root_cause.rule == "integrity_on_success":
        text += " The run exited normally, but its results cannot be trusted."
    if diagnosis.root_cause.frame:
        text += f" Innermost frame: {diagnosis.root_cause.frame}."
    symptoms = later_lines(story)
    if symptoms:
        categories = sorted({e.category for e in symptoms})
        ranks = _ranks_text([e.event.rank for e in symptoms if e.event.rank is not None])
        text += (
            f" {len(symptoms)} later error line(s)"
            + (f" on {ranks}" if ranks else "")
            + f" ({', '.join(categories[:4])}{' …' if len(categories) > 4 else ''})"
            + " follow from it."
        )
    for item in story.findings:
        text += f" Independent of it: {_headline(item, taxonomy)}."
    if around:
        text += f" {around}"
    if exit_text:
        text += f" {exit_text}"
    dropped = int(diagnosis.stats.get("dropped_analysis_bytes", 0))
    if dropped:
        text += f" Analysis skipped {dropped} bytes of output it could not keep up with."
    return text


def action_reason(action: str, root: Evidence, explanations: Mapping[str, str]) -> str:
    what = ACTION_TEXT.get(action, action)
    detail = root.summary
    return f"{what[0].upper()}{what[1:]}: {detail}." if detail else f"{what[0].upper()}{what[1:]}."
