"""Progress rules over the heartbeats of a job's ranks (the SDK's watchdog): the hang deadline,
which rank(s) a hang names, and which rank straggles. No I/O, no clocks: callers pass `now`
and what the heartbeats said; the thresholds are ProgressRules (thresholds.yaml).

Never name a rank without a reason recorded in the evidence (unresponsive, behind, outside
the collectives the others wait in, or all stalled).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from denpex.core.detectors import detector_evidence
from denpex.core.events import Event, Evidence
from denpex.series.thresholds import ProgressRules
from denpex.series.throughput import slower_than_peers

WAITING_PLACES = ("collective", "backward")  # where a rank waits for its peers


@dataclass(frozen=True, slots=True)
class PeerView:
    """One rank's last heartbeat, with the local monotonic times it last changed."""

    rank: int
    step: int
    beat: int
    interval_s: float | None
    busy_s: float | None
    where: str
    frame: str
    host: str
    closed: bool
    step_changed_at: float
    beat_changed_at: float
    seen: bool = True  # False: the rank never wrote a heartbeat (stopped or died early)


@dataclass(frozen=True, slots=True)
class Hang:
    culprits: tuple[PeerView, ...]
    reason: str  # unresponsive | silent | behind | outside_collective | all_stalled
    step: int
    stalled_s: float
    deadline_s: float
    reporter: int | None

    @property
    def signature(self) -> str:
        if self.reason in ("unresponsive", "silent"):
            return "train.hang.rank_unresponsive"
        return "train.hang.heartbeat_stale"

    def evidence(self, reporter: int, host: str, evidence_id: str) -> Evidence:
        ranks = ",".join(str(v.rank) for v in self.culprits)
        first = self.culprits[0]
        why = {
            "unresponsive": "its process stopped answering (stopped, frozen or dead)",
            "silent": "it never wrote a heartbeat (stopped, died or never started)",
            "behind": "it is behind the others, which wait for it",
            "outside_collective": "it is stuck outside the collective the others wait in",
            "all_stalled": "no rank completes a step",
        }[self.reason]
        noun = "rank" if len(self.culprits) == 1 else "ranks"
        captures = {
            "rank": ranks,
            "step": str(self.step),
            "seconds": f"{self.stalled_s:.1f}",
            "deadline_seconds": f"{self.deadline_s:.1f}",
            "reason": self.reason,
            "hosts": ",".join(v.host for v in self.culprits),
            "where": ";".join(f"{v.rank}:{v.where} {v.frame}".strip() for v in self.culprits),
            "reporter_rank": str(reporter),
        }
        event = Event(
            body="",
            ts_ns=time.time_ns(),
            host=first.host or host,
            source="sdk",
            kind="state",
            rank=first.rank,
            attrs={"reporter_host": host},
        )
        values = {
            "stalled_s": self.stalled_s,
            "deadline_s": self.deadline_s,
            "ranks_text": f"{noun} {ranks}",
            "why": why,
        }
        return _sdk_evidence(event, self.signature, evidence_id, captures, values)


def deadline_of(views: Iterable[PeerView], th: ProgressRules) -> float:
    """The hang deadline for these ranks: from the step times of those still running."""
    return th.deadline([v.interval_s for v in views if v.interval_s is not None and not v.closed])


def hang_evidence_id(hang: Hang) -> str:
    """Stable across reporters, so that receivers keep one copy of the same hang."""
    return f"sdk:train.hang:{','.join(str(v.rank) for v in hang.culprits)}:{hang.step}"


def judge_hang(
    views: Iterable[PeerView],
    now: float,
    th: ProgressRules,
    reporters: Collection[int] | None = None,
) -> Hang | None:
    """A hang when some rank completed no step within the deadline; names the rank(s) that
    hold the others up. The reporter is the lowest live rank among `reporters` (None: any).
    Ranks never heard from (`seen=False`) never trigger a hang, since not every rank may run
    a monitor, but they are named when one happens."""
    views = [v for v in views if not v.closed]
    active = [v for v in views if v.seen]
    if not active:
        return None
    deadline = deadline_of(active, th)
    if not any(now - v.step_changed_at > deadline for v in active):
        return None
    # Who is stuck: every rank without a step for half the deadline (≥ one median step),
    # since ranks that stopped together are seen a heartbeat tick apart.
    stalled = [v for v in active if now - v.step_changed_at > deadline / 2]
    unresponsive = [v for v in active if now - v.beat_changed_at > th.unresponsive_limit]
    silent = [v for v in views if not v.seen]
    top = max(v.step for v in active)
    behind = [v for v in stalled if v.step < top]
    outside = [v for v in stalled if v.where not in WAITING_PLACES]
    if unresponsive:
        culprits, reason = unresponsive, "unresponsive"
    elif silent:
        culprits, reason = silent, "silent"
    elif behind:
        culprits, reason = behind, "behind"
    elif outside and len(outside) < len(stalled):
        culprits, reason = outside, "outside_collective"
    else:
        culprits, reason = stalled, "all_stalled"
    alive = [
        v.rank
        for v in active
        if v not in unresponsive and (reporters is None or v.rank in reporters)
    ]
    return Hang(
        culprits=tuple(sorted(culprits, key=lambda v: v.rank)),
        reason=reason,
        step=top,
        stalled_s=max(now - v.step_changed_at for v in stalled),
        deadline_s=deadline,
        reporter=min(alive) if alive else None,
    )


@dataclass(frozen=True, slots=True)
class Straggler:
    rank: int
    step: int
    step_s: float
    group_median_s: float

    def evidence(self, reporter: int, host: str, views: Mapping[int, PeerView]) -> Evidence:
        ratio = self.step_s / self.group_median_s if self.group_median_s > 0 else float("inf")
        peer = views.get(self.rank)
        event = Event(
            body="",
            ts_ns=time.time_ns(),
            host=(peer.host if peer else "") or host,
            source="sdk",
            kind="state",
            rank=self.rank,
            attrs={"reporter_host": host},
        )
        captures = {
            "rank": str(self.rank),
            "step": str(self.step),
            "seconds": f"{self.step_s:.4f}",
            "group_median_seconds": f"{self.group_median_s:.4f}",
            "ratio": f"{ratio:.3f}",
            "reporter_rank": str(reporter),
        }
        values = {
            "pace": f"its steps take {self.step_s * 1000:.0f} ms",
            "peers_pace": f"{self.group_median_s * 1000:.0f} ms",
            "above_pct": (ratio - 1) * 100,
        }
        evidence_id = f"sdk:train.straggler:{self.rank}:{self.step}"
        return _sdk_evidence(event, "train.straggler.step_time", evidence_id, captures, values)


def _sdk_evidence(
    event: Event,
    detector_id: str,
    evidence_id: str,
    captures: dict[str, str],
    values: dict[str, Any],
) -> Evidence:
    """Detector evidence with a reporter-independent id, its event's body the summary."""
    evidence = detector_evidence(event, detector_id, captures=captures, values=values)
    evidence.id = evidence_id
    event.body = evidence.summary
    return evidence


def find_stragglers(views: Iterable[PeerView], th: ProgressRules) -> list[Straggler]:
    """Ranks whose median step time over the window is ≥ ratio × the median of their peers'
    (the peers, not the whole group, so that two ranks compare with each other)."""
    timed = {v.rank: v for v in views if v.busy_s is not None and not v.closed}
    busy = {rank: v.busy_s for rank, v in timed.items() if v.busy_s is not None}
    slow = slower_than_peers(busy, th.straggler_ratio, th.straggler_min_s)
    return [Straggler(s.member, timed[s.member].step, s.value, s.peers_median) for s in slow]
