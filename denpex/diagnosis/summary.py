"""Deterministic text for a diagnosis: the summary paragraph and each action's reason.

Built only from the diagnosis and its evidence (no model, no clock), so the same evidence
always reads the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from denpex.core.diagnosis import Diagnosis
from denpex.core.events import Evidence, format_ts
from denpex.core.taxonomy import Taxonomy
from denpex.diagnosis.rules import part_of_root_traceback
from denpex.diagnosis.timeline import before

if TYPE_CHECKING:
    from denpex.diagnosis.rules import RuleContext

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


def where(item: Evidence) -> str:
    parts = []
    if item.event.rank is not None:
        parts.append(f"rank {item.event.rank}")
    if item.event.host:
        parts.append(f"on {item.event.host}" if parts else f"host {item.event.host}")
    return " ".join(parts)


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


def summarize(
    diagnosis: Diagnosis, root: Evidence | None, ctx: RuleContext, taxonomy: Taxonomy
) -> str:
    exit_text = _exit_text(diagnosis)
    if root is None:
        warnings = [e for e in ctx.evidence if not e.is_failure and e.severity != "info"]
        failures = ctx.failures
        if diagnosis.status == "ok":
            text = "No failure found."
            if failures or warnings:
                text += (
                    f" {len(failures) + len(warnings)} warning or error line(s) were seen, "
                    "but the run ended normally."
                )
            return f"{text} {exit_text}".strip()
        return (
            "The job failed, but no line of its output matched a known failure signature. "
            f"{exit_text} Check the last lines of the output; if this failure repeats, "
            "add a signature for it."
        ).strip()

    place = where(root)
    stamp = format_ts(root.event.ts_ns)
    when = f" at {stamp[11:19]} UTC" if stamp else ""
    title = root.summary or (taxonomy[root.category].title if root.category in taxonomy else "")
    inside = " ".join(part for part in (place, when.strip()) if part)
    text = f"{title}" + (f" ({inside})." if inside else ".")
    if diagnosis.root_cause.rule == "warnings_on_failure":
        text = f"No error line matched; the strongest lead is a warning: {text}"
    symptoms = [
        e
        for e in ctx.failures
        if e.category != root.category
        and (ctx.tier(e.category) != "specific" or before(root, e))
        and not part_of_root_traceback(e, root, int(ctx.config["traceback_lines"]))
    ]
    if symptoms:
        categories = sorted({e.category for e in symptoms})
        ranks = _ranks_text([e.event.rank for e in symptoms if e.event.rank is not None])
        text += (
            f" {len(symptoms)} later error line(s)"
            + (f" on {ranks}" if ranks else "")
            + f" ({', '.join(categories[:4])}{' …' if len(categories) > 4 else ''})"
            + " follow from it."
        )
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
