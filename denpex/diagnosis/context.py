"""What every causal rule sees: the evidence in timeline order, the exit status, the rules'
data, and the few questions rules ask of it (tier, causal edges, same traceback).

Pure functions over Evidence; never does I/O, never changes the evidence it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from denpex.core.events import Evidence, severity_rank
from denpex.diagnosis.config import RulesConfig
from denpex.diagnosis.timeline import earliest, line_key, ordered, seconds_between


def is_host_context(item: Evidence) -> bool:
    """Host evidence not tied to this job (attrs.attribution == "host", DESIGN §6)."""
    return item.event.attrs.get("attribution") == "host"


@dataclass(slots=True)
class RuleContext:
    evidence: list[Evidence]  # timeline order
    exit_code: int | None
    exit_signal: str | None
    config: RulesConfig
    failures: list[Evidence] = field(init=False)

    def __post_init__(self) -> None:
        self.evidence = ordered(self.evidence)
        self.failures = [e for e in self.evidence if e.is_failure]

    def subset(self, evidence: list[Evidence]) -> RuleContext:
        """The same job and exit status over part of the evidence."""
        return RuleContext(evidence, self.exit_code, self.exit_signal, self.config)

    @property
    def known_failed(self) -> bool:
        return self.exit_signal is not None or self.exit_code not in (None, 0)

    @property
    def killed_by_sigkill(self) -> bool:
        if self.exit_signal == "SIGKILL" or self.exit_code == 137:
            return True
        marker = self.config.sigkill_marker
        return any(marker.search(e.event.body) for e in self.failures)

    def tier(self, category: str) -> str:
        if self.config.is_symptom(category):
            return "symptom"
        if self.config.is_weak(category):
            return "weak"
        return "specific"

    def software_failures(self) -> list[Evidence]:
        c = self.config
        return [
            e
            for e in self.failures
            if not (c.is_infrastructure(e.category) or c.is_oom(e.category))
        ]

    def ranks_timed_out(self) -> set[tuple[str | None, int]]:
        """The (host, rank) of every rank that reports a collective timeout, when at least
        rules.yaml `collective_timeout.min_reporting_ranks` do (else none: too few to say
        which ranks the others waited on)."""
        cfg = self.config
        ranks = {
            (e.event.host, e.event.rank)
            for e in self.failures
            if cfg.is_collective_timeout(e.category) and e.event.rank is not None
        }
        return (
            ranks if len(ranks) >= int(cfg["collective_timeout"]["min_reporting_ranks"]) else set()
        )

    def explains(self, cause: Evidence, effect: Evidence) -> bool:
        """Whether `cause` can explain `effect`: a causal edge of rules.yaml between their
        categories, on the same host (unless the cause reaches across hosts), close in time."""
        cfg = self.config
        if not cfg.explains(cause.category, effect.category):
            return False
        hosts = cause.event.host, effect.event.host
        if (
            hosts[0]
            and hosts[1]
            and hosts[0] != hosts[1]
            and not cfg.crosses_hosts(cause.category, effect.category)
        ):
            return False
        return self.close(cause, effect)

    def close(self, a: Evidence, b: Evidence) -> bool:
        """Within rules.yaml `explains_window_s` of each other, or `explains_lines` lines apart
        where they share no clock."""
        cfg = self.config
        gap = seconds_between(a, b)
        if gap is not None:
            return abs(gap) <= float(cfg["explains_window_s"])
        return abs(a.event.seq - b.event.seq) <= int(cfg["explains_lines"])

    def same_incident(self, a: Evidence, b: Evidence) -> bool:
        """On the same host (where both name one) and close: one incident's several lines."""
        hosts = a.event.host, b.event.host
        return not (hosts[0] and hosts[1] and hosts[0] != hosts[1]) and self.close(a, b)


@dataclass(slots=True)
class Finding:
    rule: str
    root: Evidence
    note: str = ""
    # the root is new evidence, not one of the matched items: inferred from other evidence (the
    # rank that did not arrive) or a matched line named anew (by its traceback's frame)
    derived: bool = False


def same_line(a: Evidence, b: Evidence) -> bool:
    """Two pieces of evidence matched on one line (one line is one timeline row)."""
    return line_key(a) == line_key(b)


def part_of_root_traceback(item: Evidence, root: Evidence, max_lines: int) -> bool:
    """A generic exception line just above the root cause in the same stream and rank is the
    root's own traceback ("Traceback (most recent call last):"), not a separate failure."""
    return (
        item.category == "app.exception"
        and item.event.attrs.get("stream") == root.event.attrs.get("stream")
        and (item.event.host, item.event.rank) == (root.event.host, root.event.rank)
        and 0 < root.event.seq - item.event.seq <= max_lines
    )


def strongest_earliest(items: list[Evidence]) -> Evidence | None:
    if not items:
        return None
    top = max(severity_rank(e.severity) for e in items)
    return earliest([e for e in items if severity_rank(e.severity) == top])
