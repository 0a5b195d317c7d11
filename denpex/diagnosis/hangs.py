"""Rule absent_from_collective: when a collective times out, the cause is the rank that did
not arrive (DESIGN §6), named from the log alone; rule diverged_collectives: ranks that wait
in different collectives took different code paths.

Two kinds of proof, thresholds in rules.yaml `collective_timeout`: ProcessGroupNCCL's "last
enqueued / last completed NCCL work" numbers (the straggler's count lags every other rank's),
and the timeout every rank but one reports (the job's world size comes from the log, in
attrs.world_size). The rank blamed is new evidence (`train.hang.*`) derived from the
timeouts; it never blames a rank that printed a failure of its own (that rank crashed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from denpex.core.detectors import detector_evidence
from denpex.core.events import Event, Evidence, severity_rank
from denpex.diagnosis.context import Finding, RuleContext
from denpex.diagnosis.timeline import before, earliest

# ProcessGroupNCCL's "[PG ID 3 PG GUID 5 Rank 1]" / "[PG 3 Rank 1]": counters are per group
_PROCESS_GROUP = re.compile(r"\[PG (?:ID )?(\d{1,6})\b")


# the detectors (core/detectors.yaml) of the proofs
_DETECTORS = {
    "lagging": "train.hang.lagging_collective",
    "absent": "train.hang.absent_from_collective",
    "diverged": "dist.collective_mismatch.diverged_collectives",
}


@dataclass(slots=True)
class _Progress:
    enqueued: int | None = None
    completed: int | None = None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _reporter(item: Evidence) -> int | None:
    """The rank that printed a timeout line (its `rank`: a signature captures the rank a
    line is about as `rank`, and another rank it names under another name)."""
    return item.event.rank


def _progress(timeouts: list[Evidence]) -> dict[int, _Progress]:
    """Each rank's NCCL work counters in the process group most ranks report on."""
    groups: dict[str, list[Evidence]] = {}
    for item in timeouts:
        found = _PROCESS_GROUP.search(item.event.body)
        groups.setdefault(found.group(1) if found else "", []).append(item)
    widest = max(groups.values(), key=lambda g: (len({_reporter(e) for e in g}), -len(g)))
    numbers: dict[int, _Progress] = {}
    for item in widest:
        rank = _reporter(item)
        enqueued, completed = (
            _int(item.captures.get("enqueued")),
            _int(item.captures.get("completed")),
        )
        if rank is None or (enqueued is None and completed is None):
            continue
        seen = numbers.setdefault(rank, _Progress())
        if enqueued is not None:
            seen.enqueued = max(enqueued, seen.enqueued if seen.enqueued is not None else enqueued)
        if completed is not None:
            seen.completed = max(
                completed, seen.completed if seen.completed is not None else completed
            )
    return numbers


def _lagging(values: dict[int, int], min_lag: int) -> int | None:
    """The one rank whose count is below every other rank's by at least `min_lag`."""
    if len(values) < 2:
        return None
    low = min(values.values())
    lowest = [rank for rank, value in values.items() if value == low]
    others = [value for rank, value in values.items() if rank not in lowest]
    if len(lowest) != 1 or not others or min(others) - low < min_lag:
        return None
    return lowest[0]


def _world_size(ctx: RuleContext) -> int | None:
    sizes = [e.event.attrs.get("world_size") for e in ctx.evidence]
    known = [s for s in sizes if isinstance(s, int) and s > 0]
    return max(known) if known else None


def _derived(
    ctx: RuleContext, rank: int | None, kind: str, body: str, timeouts: list[Evidence]
) -> Evidence:
    first = earliest(timeouts)
    assert first is not None
    # the straggler was missing from the moment the others entered the collective: the first
    # timeout less its own timeout, when the line says how long that was
    timeout_ms = _int(first.captures.get("timeout_ms"))
    ts_ns = first.event.ts_ns
    if ts_ns is not None and timeout_ms is not None:
        ts_ns -= timeout_ms * 1_000_000
    host = next(
        (
            e.event.host
            for e in ctx.evidence
            if rank is not None and e.event.rank == rank and e.event.host
        ),
        None,
    )
    ids = [int(e.id[1:]) for e in ctx.evidence if e.id[1:].isdigit()]
    event = Event(
        body=body,
        ts_ns=ts_ns,
        host=host,
        source=first.event.source,
        rank=rank,
        attrs={
            "derived": True,
            "derived_from": ",".join(e.id for e in timeouts[:20]),
            "stream": first.event.attrs.get("stream"),
            **({"ts_inherited": True} if first.event.attrs.get("ts_inherited") else {}),
        },
        seq=first.event.seq - 1,  # before the first timeout when no clock orders them
    )
    found = detector_evidence(event, _DETECTORS[kind], values={"what": body})
    found.id = f"e{max(ids, default=0) + 1}"
    return found


def _crashed(ctx: RuleContext, rank: int, first_timeout: Evidence) -> bool:
    """Whether `rank` failed on its own rather than hung: an error of its own (not a timeout,
    not hang evidence, not what the timeouts explain: the connection its timed-out peers
    closed), or any sign before the timeouts that it ended (the launcher reporting its exit, a
    kill): a rank that died is absent from a collective too."""
    cfg = ctx.config
    for item in ctx.evidence:
        if item.event.rank != rank or severity_rank(item.severity) < 1:
            continue
        if cfg.is_collective_timeout(item.category) or item.category == "train.hang":
            continue
        if before(item, first_timeout):
            return True
        if ctx.explains(first_timeout, item):
            continue  # the teardown the timeouts started: its peers closed the connection
        if item.is_failure and ctx.tier(item.category) != "symptom":
            return True
    return False


def absent_from_collective(ctx: RuleContext) -> Finding | None:
    """A collective timed out on the other ranks because one rank never reached it: the rank
    whose NCCL work counters lag, or the one rank missing from the timeout reports."""
    cfg = ctx.config
    limits = cfg["collective_timeout"]
    timeouts = [e for e in ctx.failures if cfg.is_collective_timeout(e.category)]
    reporters = {r for r in map(_reporter, timeouts) if r is not None}
    if len(reporters) < int(limits["min_reporting_ranks"]):
        return None
    # the counters also come in warnings: every rank, the straggler too, prints them when
    # asked to dump its flight recorder
    counted = [
        e
        for e in ctx.evidence
        if cfg.is_collective_timeout(e.category)
        and severity_rank(e.severity) >= 1
        and ("enqueued" in e.captures or "completed" in e.captures)
    ]
    progress = _progress(counted) if counted else {}
    min_lag = int(limits["min_lag"])
    enqueued = {r: p.enqueued for r, p in progress.items() if p.enqueued is not None}
    completed = {r: p.completed for r, p in progress.items() if p.completed is not None}
    straggler = _lagging(enqueued, min_lag)
    if straggler is None:
        straggler = _lagging(completed, min_lag)
    first_timeout = earliest(timeouts)
    assert first_timeout is not None
    if straggler is not None and not _crashed(ctx, straggler, first_timeout):
        mine = progress[straggler]
        others = sorted(r for r in progress if r != straggler)
        body = (
            f"rank {straggler} fell behind in its collectives: last enqueued NCCL work "
            f"{mine.enqueued}, last completed {mine.completed}, while ranks "
            f"{_ranks(others)} waited on later work and timed out"
        )
        found = _derived(ctx, straggler, "lagging", body, timeouts)
        return Finding("absent_from_collective", found, note="progress_numbers", derived=True)
    world = _world_size(ctx)
    if world is None or any(r >= world for r in reporters):
        return None
    absent = sorted(set(range(world)) - reporters)
    if not absent or len(absent) > int(limits["max_absent_ranks"]):
        return None
    if any(_crashed(ctx, rank, first_timeout) for rank in absent):
        return None
    missing = absent[0]
    which = (
        f"rank {missing} is the only rank"
        if len(absent) == 1
        else f"ranks {_ranks(absent)} are the only ranks"
    )
    body = (
        f"{which} of {world} that did not report the collective timeout ranks "
        f"{_ranks(sorted(reporters))} reported: {'it' if len(absent) == 1 else 'they'} never "
        "reached the collective"
    )
    found = _derived(ctx, missing, "absent", body, timeouts)
    return Finding("absent_from_collective", found, derived=True)


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}–{ranks[-1]}"
    return ", ".join(map(str, ranks[:12])) + (" …" if len(ranks) > 12 else "")


def _tensors(item: Evidence) -> set[str]:
    names = item.captures.get("tensors", "").replace(" ...", "").split(",")
    return {n.strip() for n in names if n.strip()}


def diverged_collectives(ctx: RuleContext) -> Finding | None:
    """Ranks in different collectives (rules.yaml `diverged_collectives`): the latest stall
    report of each rank lists the tensors it did not submit; when two or more ranks are each
    missing tensors and no two of them miss a name in common, every one of them submitted
    something another did not, so none is simply behind: they took different code paths."""
    limits = ctx.config["diverged_collectives"]
    wanted = set(limits["signatures"])
    latest: dict[int, Evidence] = {}
    for item in ctx.evidence:
        if item.signature in wanted and item.event.rank is not None and _tensors(item):
            latest[item.event.rank] = item
    if len(latest) < int(limits["min_ranks"]):
        return None
    missing = {rank: _tensors(item) for rank, item in sorted(latest.items())}
    ranks = list(missing)
    if any(missing[a] & missing[b] for i, a in enumerate(ranks) for b in ranks[i + 1 :]):
        return None
    shown = "; ".join(f"rank {r} misses {', '.join(sorted(missing[r])[:2])}" for r in ranks[:4])
    body = (
        f"ranks {_ranks(ranks)} wait in different collectives, each for tensors the others "
        f"never submitted ({shown}): they took different code paths"
    )
    reports = sorted(latest.values(), key=lambda e: e.event.seq)
    found = _derived(ctx, None, "diverged", body, reports)
    return Finding("diverged_collectives", found, derived=True)
