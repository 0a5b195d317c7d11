"""The causal rules of DESIGN §6, each a small named function over a RuleContext.

A rule returns a Finding (the evidence it blames and why) or None. The engine tries them in
a fixed precedence; thresholds and causal edges come from rules.yaml. Rules never do I/O.
"""

from __future__ import annotations

from collections.abc import Callable

from denpex.core.events import Evidence, severity_rank
from denpex.diagnosis.context import (
    Finding,
    RuleContext,
    part_of_root_traceback,
    strongest_earliest,
)
from denpex.diagnosis.hangs import absent_from_collective, diverged_collectives
from denpex.diagnosis.timeline import before, earliest, line_key, order_key, seconds_between


def _found(rule: str, root: Evidence | None, note: str = "") -> Finding | None:
    return Finding(rule, root, note) if root is not None else None


def hardware_first(ctx: RuleContext) -> Finding | None:
    """GPU, fabric or host-hardware failure evidence within a window of the first software
    failure (or with no software failure at all) is the cause; software errors are symptoms.

    Hardware absorbs only what it can explain (rules.yaml `explains`, on its host): when the
    first specific software failure is one it cannot explain (ENOSPC, an ImportError) and came
    first, the two are independent and the earlier one is the root cause. Where one incident
    shows in several hardware lines, the device's own report names it."""
    cfg = ctx.config
    ended = earliest([e for e in ctx.failures if cfg.is_scheduler(e.category)])
    hardware = [
        e
        for e in ctx.failures
        if cfg.is_infrastructure(e.category) and (ended is None or before(e, ended))
    ]
    if not hardware:
        return None
    software = ctx.software_failures()
    first_software = earliest(software)
    if first_software is not None:
        window_before = float(cfg["hardware_window_before_s"])
        window_after = float(cfg["hardware_window_after_s"])

        def in_window(item: Evidence) -> bool:
            gap = seconds_between(item, first_software)
            if gap is None:
                return True  # no common clock: hardware outranks software by rule
            return -window_after <= gap <= window_before

        hardware = [e for e in hardware if in_window(e)]
    first_specific = earliest(
        [
            e
            for e in software
            if ctx.tier(e.category) == "specific" and not cfg.is_scheduler(e.category)
        ]
    )
    if first_specific is not None:
        hardware = [
            e for e in hardware if before(e, first_specific) or ctx.explains(e, first_specific)
        ]
    root = strongest_earliest(hardware)
    if root is None:
        return None
    # the device's own report names the incident its link errors began (rules.yaml
    # `hardware_named_by`: the Xid 79 after AER's 'Surprise Down')
    named = [
        e
        for e in hardware
        if cfg.names_hardware(e.category, root.category) and ctx.same_incident(root, e)
    ]
    return Finding("hardware_first", strongest_earliest(named) or root)


def oom_killer(ctx: RuleContext) -> Finding | None:
    """Kernel OOM-killer evidence and a job that ended by SIGKILL: the host ran out of memory."""
    kills = [e for e in ctx.failures if ctx.config.is_oom(e.category)]
    if not kills or not ctx.killed_by_sigkill:
        return None
    return _found("oom_killer", earliest(kills), note="sigkill")


def numerics(ctx: RuleContext) -> Finding | None:
    """NaN/Inf (or a run of fp16 overflows) before the first crash outranks the crash."""
    cfg = ctx.config
    first_crash = earliest(
        [e for e in ctx.failures if not (cfg.is_numeric(e.category) or cfg.is_overflow(e.category))]
    )

    def early(item: Evidence) -> bool:
        return first_crash is None or before(item, first_crash)

    numeric = [
        e
        for e in ctx.evidence
        if cfg.is_numeric(e.category) and severity_rank(e.severity) >= 1 and early(e)
    ]
    if numeric:
        return _found("numerics", earliest(numeric))
    overflow = [e for e in ctx.evidence if cfg.is_overflow(e.category) and early(e)]
    if len(overflow) >= int(cfg["overflow_repeat"]) or any(e.is_failure for e in overflow):
        hard = [e for e in overflow if e.is_failure]
        return _found("numerics", earliest(hard) or earliest(overflow), note="overflow")
    return None


def _first_of_tier(ctx: RuleContext, tier: str) -> Evidence | None:
    return earliest([e for e in ctx.failures if ctx.tier(e.category) == tier])


def first_failing_rank(ctx: RuleContext) -> Finding | None:
    """The earliest specific failure on any rank is the cause (watchdog timeouts, peer
    failures and generic errors on other ranks come after it and are symptoms).

    Hardware evidence that `hardware_first` left out (outside its window) is unrelated, and a
    failure after the scheduler ended the job is part of the shutdown, not its cause."""
    cfg = ctx.config
    ended = earliest([e for e in ctx.failures if cfg.is_scheduler(e.category)])
    candidates = [
        e
        for e in ctx.failures
        if ctx.tier(e.category) == "specific"
        and not cfg.is_infrastructure(e.category)
        and not cfg.is_scheduler(e.category)
        and (ended is None or before(e, ended))
    ]
    root = earliest(candidates)
    return Finding("first_failing_rank", root) if root else None


def scheduler(ctx: RuleContext) -> Finding | None:
    """The scheduler cancelled the job (time limit, preemption): SIGTERM tracebacks follow.
    A cancel that follows the launcher's report of a task's own failure is the launcher
    ending the step (rules.yaml `launcher_cancel`: srun under --kill-on-bad-exit), not this."""
    cfg = ctx.config
    ended = earliest([e for e in ctx.failures if cfg.is_scheduler(e.category)])
    if ended is None:
        return None
    if cfg.is_launcher_cancel(ended.category) and any(
        cfg.is_task_failure_report(e.signature) and before(e, ended) for e in ctx.evidence
    ):
        return None
    return Finding("scheduler", ended)


def _before_teardown(ctx: RuleContext, items: list[Evidence]) -> list[Evidence]:
    """Generic failures after the first symptom (a watchdog timeout, a peer failure) are
    part of the teardown it starts: aborts, core dumps, re-raised exceptions — except the
    failure of a rank that is absent from a collective its peers timed out in: the peers
    waited on it, and its own error is no part of their teardown."""
    first_symptom = _first_of_tier(ctx, "symptom")
    if first_symptom is None:
        return items
    waiting = ctx.ranks_timed_out()
    return [
        e
        for e in items
        if before(e, first_symptom)
        or (e.event.rank is not None and waiting and (e.event.host, e.event.rank) not in waiting)
    ]


def first_failing_weak(ctx: RuleContext) -> Finding | None:
    """With nothing specific, the earliest generic failure — unless it is a bare exception,
    which `exception_fallback` names with less confidence."""
    weak = _before_teardown(ctx, [e for e in ctx.failures if ctx.tier(e.category) == "weak"])
    # a line matched both as a bare exception and as something more telling: keep the latter
    root = min(weak, key=lambda e: (order_key(e), e.category == "app.exception"), default=None)
    if root is None or root.category == "app.exception":
        return None
    return Finding("first_failing_weak", root)


def _reported_death(
    ctx: RuleContext, categories: list[str], severities: list[str]
) -> Evidence | None:
    """The earliest launcher's or parent's report that a process died by a signal (a warning
    of one of `categories`), when nothing but its symptoms failed before it."""
    wanted = set(categories)
    deaths = [e for e in ctx.evidence if e.category in wanted and e.severity in severities]
    death = earliest(deaths)
    if death is None:
        return None
    # a launcher reports the death when it tears the job down, after the peers' watchdog
    # timeouts and "another rank failed" lines that the death caused: those do not count, nor
    # does another reading of such a line (Horovod's "RuntimeError: … processes exited" is
    # also an exception line)
    symptom_lines = {line_key(e) for e in ctx.evidence if ctx.tier(e.category) == "symptom"}
    symptom_lines.add(line_key(death))
    earlier = [
        e
        for e in ctx.failures
        if before(e, death)
        and line_key(e) not in symptom_lines
        and ctx.tier(e.category) != "symptom"
    ]
    return None if earlier else death  # after another failure: the teardown, not the cause


def likely_oom_kill(ctx: RuleContext) -> Finding | None:
    """A process killed by SIGKILL, and nothing but its symptoms failed before it: without the
    kernel's word, the host's OOM killer is the likely sender (rules.yaml `likely_oom`). The
    kill is a launcher's or the parent's report (`exits with return code = -9`, `died with
    <Signals.SIGKILL: 9>`), a warning of an `oom_categories` category."""
    cfg = ctx.config
    kill = _reported_death(ctx, list(cfg["oom_categories"]), cfg["likely_oom"]["severities"])
    return _found("likely_oom_kill", kill)


def crash_signal(ctx: RuleContext) -> Finding | None:
    """A process that its launcher or parent reports dead of a crash signal (torchrun's
    `exitcode: -11`, DeepSpeed's `return code = -7`, mp.spawn's `terminated with signal
    SIGSEGV`), and nothing but its symptoms failed before it: a crash in native code
    (rules.yaml `crash_signal`), not the peer failure the same line also reports."""
    cfg = ctx.config["crash_signal"]
    return _found("crash_signal", _reported_death(ctx, cfg["categories"], cfg["severities"]))


def exception_fallback(ctx: RuleContext) -> Finding | None:
    """An uncaught exception with no more specific evidence: app.exception."""
    exceptions = [e for e in ctx.failures if e.category == "app.exception"]
    root = earliest(_before_teardown(ctx, exceptions))
    return Finding("exception_fallback", root) if root else None


def symptoms_only(ctx: RuleContext) -> Finding | None:
    """Only symptoms were seen (e.g. watchdog timeouts): blame the earliest, with low confidence."""
    root = _first_of_tier(ctx, "symptom")
    return Finding("symptoms_only", root) if root else None


def warnings_on_failure(ctx: RuleContext) -> Finding | None:
    """The job failed (its exit status says so, or symptoms such as watchdog timeouts show
    it) but printed no error line of its own: the strongest warning before the first symptom
    from a category that can end a job (a degraded PCIe link, a thermal slowdown, a hang
    detector) is a better lead than the symptoms."""
    first_symptom = _first_of_tier(ctx, "symptom")
    if not ctx.known_failed and first_symptom is None:
        return None
    # the header of a symptom's own traceback ("Traceback …" above Gloo's "Timed out
    # waiting") is that symptom, not a lead that came before it
    symptoms = [e for e in ctx.failures if ctx.tier(e.category) == "symptom"]
    lines = int(ctx.config["traceback_lines"])
    leads = [
        e
        for e in ctx.evidence
        if e.severity == "warning"
        and ctx.config.can_explain_failure(e.category)
        and (first_symptom is None or before(e, first_symptom))
        and not any(part_of_root_traceback(e, s, lines) for s in symptoms)
    ]
    # a traceback header is the weakest lead: any other category's warning goes first
    leads = [e for e in leads if e.category != "app.exception"] or leads
    root = strongest_earliest(leads)
    return Finding("warnings_on_failure", root) if root else None


# Precedence, highest first. `first_failing_rank` sits above `scheduler` because a specific
# failure before a cancel is what the user must fix; `numerics` above it because a NaN is
# what makes the later crash happen; `absent_from_collective` below it because a rank that
# crashed is absent from a collective too, and its crash is the cause; `likely_oom_kill` and
# `crash_signal` below `first_failing_weak` because a line that says both "killed" and what
# died (a DataLoader worker) names its failure, and above `exception_fallback` because the
# parent's exception about its SIGKILLed or crashed child is the death's consequence.
RULES: tuple[Callable[[RuleContext], Finding | None], ...] = (
    hardware_first,
    oom_killer,
    numerics,
    first_failing_rank,
    absent_from_collective,
    diverged_collectives,
    scheduler,
    first_failing_weak,
    likely_oom_kill,
    crash_signal,
    exception_fallback,
    warnings_on_failure,
    symptoms_only,
)


def integrity_on_success(ctx: RuleContext) -> Finding | None:
    """A run that exited 0 failed all the same when its results are wrong: silent data
    corruption, a NaN loss, a checkpoint that failed verification (rules.yaml
    `failure_even_on_success`). Every other line of such a run is noise."""
    if ctx.exit_code != 0:
        return None
    wrong = [e for e in ctx.evidence if ctx.config.fails_even_on_success(e)]
    root = strongest_earliest(wrong)
    return Finding("integrity_on_success", root) if root else None
