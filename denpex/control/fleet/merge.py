"""`merge`: incident grouping and dedupe. One incident per cause (kind, component): a
candidate for a cause that already has an open incident grows it with the new evidence and
jobs (never a twin); a recovered host resolves its own and its GPUs' incidents; a host or
GPU incident whose failed jobs a shared cause now explains is resolved, citing that cause.

Pure: returns what the store should do; never writes, never reads the clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from denpex.control.fleet.model import (
    HARDWARE_KINDS,
    Incident,
    IncidentCandidate,
    IncidentResolution,
    IncidentUpdate,
    MergeResult,
)


def _union(*groups: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(item for group in groups for item in group))


def _combine(candidates: list[IncidentCandidate]) -> IncidentCandidate:
    """Several rules (or one rule over several categories) naming the same cause: one
    candidate with everything they cite, the strongest one's words and confidence."""
    strongest = max(candidates, key=lambda c: (c.confidence, c.rule))
    if len(candidates) == 1:
        return strongest
    return replace(
        strongest,
        rule=strongest.rule,
        evidence=_union(*(c.evidence for c in candidates)),
        jobs=_union(*(c.jobs for c in candidates)),
        hosts=tuple(sorted(set().union(*(c.hosts for c in candidates)))),
        tenants=tuple(sorted(set().union(*(c.tenants for c in candidates)))),
        first_ns=min(c.first_ns for c in candidates),
        last_ns=max(c.last_ns for c in candidates),
    )


def _opened(candidate: IncidentCandidate, rules: tuple[str, ...]) -> Incident:
    return Incident(
        id=None,
        kind=candidate.kind,
        component=candidate.component,
        category=candidate.category,
        confidence=candidate.confidence,
        rules=rules,
        evidence=candidate.evidence,
        jobs=candidate.jobs,
        hosts=candidate.hosts,
        first_ns=candidate.first_ns,
        last_ns=candidate.last_ns,
        explanation=candidate.explanation,
        action=candidate.action,
        tenants=candidate.tenants,
        score=candidate.score,
    )


def _grown(
    incident: Incident, candidate: IncidentCandidate, rules: tuple[str, ...]
) -> IncidentUpdate | None:
    known_evidence, known_jobs = set(incident.evidence), set(incident.jobs)
    added_evidence = tuple(e for e in candidate.evidence if e not in known_evidence)
    added_jobs = tuple(j for j in candidate.jobs if j not in known_jobs)
    if not added_evidence and not added_jobs:
        return None  # the same cause seen again with nothing new: no change at all
    grown = replace(
        incident,
        confidence=max(incident.confidence, candidate.confidence),
        score=max(incident.score, candidate.score),
        rules=_union(incident.rules, rules),
        evidence=incident.evidence + added_evidence,
        jobs=incident.jobs + added_jobs,
        hosts=tuple(sorted(set(incident.hosts) | set(candidate.hosts))),
        tenants=tuple(sorted(set(incident.tenants) | set(candidate.tenants))),
        first_ns=min(incident.first_ns, candidate.first_ns),
        last_ns=max(incident.last_ns, candidate.last_ns),
        explanation=candidate.explanation,
    )
    return IncidentUpdate(grown, added_evidence, added_jobs, candidate.rule)


def _clears(incident: Incident, host: str) -> bool:
    """Whether a recovered host clears this incident: the host's own, or one of its GPUs'."""
    if incident.kind == "host":
        return incident.component == host
    return incident.kind == "gpu" and incident.hosts == (host,)


def merge(
    open_incidents: Iterable[Incident],
    candidates: Iterable[IncidentCandidate],
    resolved: Iterable[Incident] = (),
) -> MergeResult:
    """What to open, grow and resolve so that each cause has exactly one open incident.

    `open_incidents` are the store's incidents that are not resolved (open or
    acknowledged); an acknowledged incident grows like an open one. `resolved` are resolved
    ones: a candidate that names only jobs a resolved incident of its cause already held
    was dealt with (an operator closed it) and opens nothing again while its strikes stay in
    the window."""
    closed: dict[tuple[str, str], set[str]] = {}
    for incident in resolved:
        closed.setdefault(incident.key, set()).update(incident.jobs)
    candidates = [
        c
        for c in candidates
        if not (c.jobs and c.verdict == "suspect" and set(c.jobs) <= closed.get(c.key, set()))
    ]
    current: dict[tuple[str, str], Incident] = {}
    for incident in open_incidents:
        if incident.state != "resolved":
            current.setdefault(incident.key, incident)
    suspects: dict[tuple[str, str], list[IncidentCandidate]] = {}
    recovered: dict[str, IncidentCandidate] = {}
    for candidate in candidates:
        if candidate.verdict == "recovered":
            recovered.setdefault(candidate.component, candidate)
        else:
            suspects.setdefault(candidate.key, []).append(candidate)

    result = MergeResult()
    for key in sorted(suspects):
        group = suspects[key]
        combined = _combine(group)
        rules = _union(c.rule for c in group)
        existing = current.get(key)
        if existing is None:
            result.opened.append(_opened(combined, rules))
            continue
        update = _grown(existing, combined, rules)
        if update is not None:
            result.updated.append(update)

    blamed_hosts = {
        h
        for key, group in suspects.items()
        if key[0] in ("host", "gpu")
        for c in group
        for h in c.hosts
    }
    for host in sorted(recovered):
        if host in blamed_hosts:
            continue  # suspected again in the same pass: suspicion wins over recovery
        candidate = recovered[host]
        for key in sorted(current):
            incident = current[key]
            if _clears(incident, host):
                result.resolved.append(
                    IncidentResolution(
                        incident, candidate.rule, candidate.evidence, candidate.explanation
                    )
                )
    result.resolved.extend(_explained_away(current, suspects, result))
    return result


def _explained_away(
    current: dict[tuple[str, str], Incident],
    suspects: dict[tuple[str, str], list[IncidentCandidate]],
    result: MergeResult,
) -> list[IncidentResolution]:
    """A host or GPU incident opened before a shared cause was known (a driver rollout,
    a switch) whose every failed job that cause now explains: resolved, citing the cause,
    so that no host stays blamed for what was never its fault."""
    shared = [c for group in suspects.values() for c in group if c.kind not in HARDWARE_KINDS]
    done = {r.incident.key for r in result.resolved}
    out = []
    for key in sorted(current):
        incident = current[key]
        if incident.kind not in HARDWARE_KINDS or key in suspects or key in done:
            continue
        for cause in shared:
            explained = (
                set(incident.jobs) <= set(cause.jobs)
                if incident.jobs
                else set(incident.evidence) <= set(cause.evidence)
            )
            if explained:
                text = f"explained by {cause.kind} {cause.component}: {cause.explanation}"
                cited = tuple(e for e in incident.evidence if e in set(cause.evidence))
                out.append(IncidentResolution(incident, cause.rule, cited, text))
                break
    return out
