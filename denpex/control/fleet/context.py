"""What every fleet rule looks at: the view's strikes and warnings, the topology, each
host's recovery point, which strikes a higher rule already explained, and the one way a
rule turns strikes into an IncidentCandidate.

Pure: built from a FleetView and `now_ns`; never reads the store or the clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from denpex.control.fleet.config import FleetConfig
from denpex.control.fleet.model import EvidenceRecord, FleetView, IncidentCandidate
from denpex.control.fleet.strikes import Strike, build_strikes, normal_pci, warnings_in

Unit = tuple[str, str | None]  # (host, GPU PCI address): a rail's members are GPUs


@dataclass(slots=True)
class FleetContext:
    view: FleetView
    now_ns: int
    config: FleetConfig
    strikes: list[Strike] = field(init=False)
    warnings: list[EvidenceRecord] = field(init=False)
    consumed: set[int] = field(init=False, default_factory=set)  # id() of explained strikes
    consumed_warnings: set[str] = field(init=False, default_factory=set)
    cutoff: dict[str, int] = field(init=False, default_factory=dict)  # host → recovered at
    host_jobs: Counter[str] = field(init=False, default_factory=Counter)
    _members: dict[str, dict[str, set[Unit]]] = field(init=False, default_factory=dict)
    _rails: dict[str, dict[str | None, str]] = field(init=False, default_factory=dict)
    _label_counts: Counter[tuple[str, str]] | None = field(init=False, default=None)
    _label_totals: Counter[str] = field(init=False, default_factory=Counter)
    _job_label_counts: Counter[tuple[str, str]] = field(init=False, default_factory=Counter)
    _job_label_totals: Counter[str] = field(init=False, default_factory=Counter)

    def __post_init__(self) -> None:
        self.strikes = build_strikes(self.view, self.now_ns, self.config)
        self.warnings = warnings_in(self.view, self.now_ns, self.config)
        since = self.now_ns - self.config.lookback_ns
        for job in self.view.jobs:
            if since <= job.ended_ns <= self.now_ns:
                self.host_jobs.update(set(job.hosts))
        self._find_recovery_points()

    # -- recovery ------------------------------------------------------------------------
    def clean_jobs_since(self, host: str, since_ns: int) -> int:
        state = self.view.hosts.get(host)
        if state is not None and state.clean_jobs_since is not None:
            return state.clean_jobs_since
        return sum(
            1
            for job in self.view.jobs
            if host in job.hosts
            and not job.failed
            and (job.started_ns if job.started_ns is not None else job.ended_ns) >= since_ns
        )

    def _find_recovery_points(self) -> None:
        need = int(self.config["recovered"]["min_clean_jobs"])
        for host, state in self.view.hosts.items():
            passed = state.diagnostics_passed_ns
            if passed is None or passed > self.now_ns:
                continue
            if self.clean_jobs_since(host, passed) >= need:
                self.cutoff[host] = passed

    def after_recovery(self, strike: Strike) -> bool:
        """Whether a strike still counts against its host: it came after the host's last
        recovery (diagnostics passed and enough clean jobs), or the host never recovered."""
        if strike.host is None:
            return True
        return strike.ts_ns > self.cutoff.get(strike.host, -1)

    # -- strikes -------------------------------------------------------------------------
    def open_strikes(self) -> list[Strike]:
        """Strikes no higher rule has explained yet, in time order."""
        return [s for s in self.strikes if id(s) not in self.consumed]

    def consume(self, strikes: Iterable[Strike]) -> None:
        self.consumed.update(id(s) for s in strikes)

    def open_warnings(self) -> list[EvidenceRecord]:
        return [w for w in self.warnings if w.id not in self.consumed_warnings]

    def consume_warnings(self, warnings: Iterable[EvidenceRecord]) -> None:
        self.consumed_warnings.update(w.id for w in warnings)

    def implicating(self, strike: Strike) -> bool:
        """Whether a strike can make its host or GPU suspect (its category is not the job's
        own or the scheduler's)."""
        return strike.hardware or not self.config.is_host_neutral(strike.category)

    # -- topology ------------------------------------------------------------------------
    def members(self, kind: str) -> dict[str, set[Unit]]:
        """Component id → the units behind it: hosts, or (host, GPU) pairs for rails."""
        if kind in self._members:
            return self._members[kind]
        out: dict[str, set[Unit]] = self._members.setdefault(kind, {})
        for host, place in self.view.topology.items():
            if kind == "rail":
                for pci, rail in place.rails.items():
                    out.setdefault(rail, set()).add((host, normal_pci(pci)))
                continue
            value = getattr(place, kind, None)
            if value:
                out.setdefault(value, set()).add((host, None))
        return out

    def population(self, kind: str) -> int:
        """How many units (hosts; GPUs for rails) sit behind some component of `kind`."""
        return len(set().union(*self.members(kind).values()))

    def _rails_of(self, host: str) -> dict[str | None, str]:
        rails = self._rails.get(host)
        if rails is None:
            place = self.view.topology.get(host)
            rails = {normal_pci(p): r for p, r in place.rails.items()} if place else {}
            self._rails[host] = rails
        return rails

    def units_of(self, kind: str, host: str | None, pci: str | None) -> list[tuple[str, Unit]]:
        """(component, unit) pairs of `kind` that a failure on host (and GPU) falls under."""
        place = self.view.topology.get(host) if host else None
        if place is None or host is None:
            return []
        if kind == "rail":
            key = normal_pci(pci)
            rails = self._rails_of(host)
            return [(rails[key], (host, key))] if key in rails else []
        value = getattr(place, kind, None)
        return [(value, (host, None))] if value else []

    def spread(self, hosts: set[str]) -> tuple[int, float]:
        """How many distinct leaf switches (racks where switches are unknown) the hosts sit
        behind, and the largest share any one holds; (len(hosts), share) with no topology."""
        for kind in ("switch", "rack"):
            where = [getattr(self.view.topology.get(h), kind, None) for h in hosts]
            known = [w for w in where if w]
            if known:
                top = Counter(known).most_common(1)[0][1]
                return len(set(known)), top / len(known)
        return len(hosts), (1 / len(hosts) if hosts else 1.0)

    def labels_of(self, strike: Strike) -> dict[str, str]:
        """The dependencies a strike's job ran on: what the job reported (true at its time),
        else what its host reports now."""
        labels: dict[str, str] = {}
        state = self.view.hosts.get(strike.host) if strike.host else None
        if state is not None:
            labels.update(state.labels)
        if strike.job is not None:
            labels.update(strike.job.labels)
        return labels

    def fleet_share(self, key: str, value: str) -> float:
        """The share of the fleet's exposure with key=value: of the view's jobs when jobs
        report the label (true at their time, like the strikes' own), else of the hosts."""
        if self._label_counts is None:
            self._label_counts = Counter()
            for state in self.view.hosts.values():
                self._label_counts.update(state.labels.items())
                self._label_totals.update(state.labels.keys())
            for job in self.view.jobs:
                self._job_label_counts.update(job.labels.items())
                self._job_label_totals.update(job.labels.keys())
        if self._job_label_totals[key]:
            return self._job_label_counts[(key, value)] / self._job_label_totals[key]
        if self._label_totals[key]:
            return self._label_counts[(key, value)] / self._label_totals[key]
        return 1.0

    def warnings_on(self, hosts: set[str], start_ns: int, end_ns: int) -> list[EvidenceRecord]:
        return [w for w in self.warnings if w.host in hosts and start_ns <= w.ts_ns <= end_ns]  # type: ignore[operator]

    # -- candidates ----------------------------------------------------------------------
    def candidate(
        self,
        rule: str,
        kind: str,
        component: str,
        score: float,
        strikes: list[Strike],
        explanation: str,
        *,
        warnings: Iterable[EvidenceRecord] = (),
        category: str | None = None,
        verdict: str = "suspect",
        hosts: tuple[str, ...] = (),
    ) -> IncidentCandidate:
        warnings = list(warnings)
        evidence = tuple(
            dict.fromkeys([i for s in strikes for i in s.evidence] + [w.id for w in warnings])
        )
        times = [s.ts_ns for s in strikes] + [w.ts_ns for w in warnings if w.ts_ns is not None]
        jobs = tuple(dict.fromkeys(s.job.job for s in strikes if s.job is not None))
        hosts = tuple(
            sorted(
                {s.host for s in strikes if s.host}
                | {w.host for w in warnings if w.host}
                | set(hosts)
            )
        )
        tenants = tuple(
            sorted(
                {s.tenant for s in strikes if s.tenant} | {w.tenant for w in warnings if w.tenant}
            )
        )
        if category is None:
            category = (
                Counter(s.category for s in strikes).most_common(1)[0][0] if strikes else "unknown"
            )
        return IncidentCandidate(
            rule=rule,
            kind=kind,
            component=component,
            category=category,
            confidence=self.config.confidence(rule, score),
            evidence=evidence,
            jobs=jobs,
            hosts=hosts,
            first_ns=min(times, default=self.now_ns),
            last_ns=max(times, default=self.now_ns),
            explanation=explanation,
            verdict=verdict,
            action=self.config.action(kind) if verdict == "suspect" else "none",
            tenants=tenants,
            score=round(score, 3),
        )
