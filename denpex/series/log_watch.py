"""Training series read from a job's log: the numbers of parse.py, one series per (host, rank),
fed to the same detectors the SDK runs, so that a log whose loss goes NaN, diverges, whose
loss scale collapses or whose steps stop or slow down becomes evidence with its step.

It only reads what the scanner hands it and returns Evidence (the scanner numbers and keeps
it); it never reads a clock: times are the lines' own or their arrival times. A job that
stops printing without a last line leaves no gap to measure.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Protocol

from denpex.core.detectors import detector_evidence
from denpex.core.events import Event, Evidence
from denpex.series.findings import Finding, fmt
from denpex.series.loss import LossSpikeDetector, NonFiniteLoss, nan_finding
from denpex.series.loss_scale import LossScaleTracker
from denpex.series.parse import PARSE_LIMIT, StepNumbers, parse_candidate, wants
from denpex.series.sampling import LineSampler, Tail, literal_lines
from denpex.series.thresholds import (
    LossRules,
    LossScaleRules,
    ProgressRules,
    ThroughputRules,
    default,
)
from denpex.series.throughput import ThroughputDrop, slower_than_peers

MAX_SERIES = 4096  # series followed; more are not (a log of that many is rare)
# the wrapper's two pipes carry one job; any other stream (a file of `denpex scan`) is its own
JOB_STREAMS = ("stdout", "stderr")
MIN_TIMED_OBSERVATIONS = 3  # a series needs this many timed lines before its gaps mean anything


def _joined_len(lines: Sequence[bytes]) -> int:
    return sum(map(len, lines)) + max(0, len(lines) - 1)


def _lines_with_literals(batch: _Batch, skip: int) -> Iterator[int]:
    """The lines of `batch` that may hold numbers (sampling.literal_lines), leaving out those
    wholly within its first `skip` bytes."""
    joined = batch.joined
    start = joined.rfind(b"\n", 0, skip) + 1 if skip > 0 else 0
    return literal_lines(joined, start, getattr(batch.lines, "line_at", None))


def _job(stream: str) -> str:
    """The wrapper's two pipes carry one job; any other stream (a file) is its own."""
    return "job" if stream in JOB_STREAMS else stream


class ParsedLine(Protocol):
    """What the scanner knows of a line (denpex.lite.prefixes.ParsedLine fits it)."""

    body: bytes
    ts_ns: int | None
    host: str | None
    rank: int | None
    pid: int | None
    attrs: dict[str, Any]  # `rank_from_message`: the rank was read from the message itself


@dataclass(slots=True)
class _Where:
    """The line an observation came from, for the evidence built from it."""

    body: str
    seq: int
    stream: str
    ts_ns: int | None
    pid: int | None
    fmt: str


@dataclass(slots=True)
class _Batch:
    """A batch as observe was handed it, kept for the end of its log (sampling.Tail)."""

    lines: Sequence[bytes]
    joined: bytes  # the lines joined by newlines
    parsed_at: Callable[[int], ParsedLine]
    first_seq: int
    arrival_ns: int | None
    stream: str
    read: set[int]


@dataclass(slots=True)
class _Series:
    job: str  # the stream (group) it was read from: series of different logs never mix
    host: str | None
    rank: int | None
    spikes: LossSpikeDetector
    nan: NonFiniteLoss
    scale: LossScaleTracker
    drop: ThroughputDrop | None = None
    observations: int = 0
    last_step: int | None = None
    total_steps: int | None = None
    skipped_total: int | None = None
    times: deque[int] = field(default_factory=lambda: deque(maxlen=64))
    costs: deque[float] = field(default_factory=lambda: deque(maxlen=64))  # s/step or 1/rate
    measure: str | None = None
    last: _Where | None = None

    @property
    def subject(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else "the job"


class LogSeries:
    """Every training series of one analysis. `observe` per batch of lines, `finish` once at
    the end (hangs and stragglers are judged over the whole log)."""

    def __init__(
        self,
        loss: LossRules | None = None,
        loss_scale: LossScaleRules | None = None,
        throughput: ThroughputRules | None = None,
        progress: ProgressRules | None = None,
    ) -> None:
        self.loss = loss or default(LossRules)
        self.loss_scale = loss_scale or default(LossScaleRules)
        self.throughput = throughput or default(ThroughputRules)
        self.progress = progress or default(ProgressRules)
        self.series: dict[tuple[str, str | None, int | None], _Series] = {}
        self.latest_ns: dict[str, int] = {}  # per job: the latest time any of its lines had
        self.parsed_lines = 0  # lines the detectors judged (the sample)
        self.sampler = LineSampler()  # which lines of each log are read
        self.tail: Tail[_Batch] = Tail()  # ... and the end of each, read whole once it ended
        self._finished = False

    # -- per batch -------------------------------------------------------------------------
    def observe(
        self,
        joined: bytes,
        lines: Sequence[bytes],
        parsed_at: Callable[[int], ParsedLine],
        first_seq: int,
        arrival_ns: int | None,
        stream: str,
        nonfinite: list[int] | None = None,
    ) -> list[tuple[int, Evidence]]:
        """Read the numbers of a batch of lines (`joined` is them joined, tested first);
        returns (line index, evidence) for what the detectors found. `nonfinite`: the lines
        denpex.core.scan_cues.NONFINITE_PATTERN matches, when the caller's pass found them."""
        job = _job(stream)
        self._saw(job, arrival_ns)
        if not wants(joined):
            return []
        found: list[tuple[int, Evidence]] = []
        # the scanner blanked SDK lines since joining (a native batch is never edited: a list)
        if isinstance(lines, list) and len(joined) != _joined_len(lines):
            joined, nonfinite = b"\n".join(lines), None
        # judging a line (its prefixes, its numbers, the detectors) costs several µs: a long
        # log's lines are sampled (sampling.py)
        read = self.sampler.lines_to_read(job, joined, getattr(lines, "line_at", None), nonfinite)
        batch = _Batch(lines, joined, parsed_at, first_seq, arrival_ns, stream, set(read))
        self.tail.keep(job, len(joined), batch)
        for index in read:
            line = self._read(job, batch, index, create=True)
            if line is not None:
                self.parsed_lines += 1
                series, numbers, where = line
                for finding in self._judge(series, numbers, where):
                    found.append((index, self._evidence(series, finding, where)))
        return found

    def _read(
        self, job: str, batch: _Batch, index: int, *, create: bool
    ) -> tuple[_Series, StepNumbers, _Where] | None:
        """The numbers of one line with the series they belong to, or None."""
        head = batch.lines[index][:PARSE_LIMIT]
        if not wants(head):
            return None
        numbers = parse_candidate(head)
        if numbers is None:
            return None
        parsed = batch.parsed_at(index)
        ts = parsed.ts_ns if parsed.ts_ns is not None else batch.arrival_ns
        self._saw(job, ts)
        # the line's prefix says whose it is; a rank inside the message (DeepSpeed's
        # `[Rank 0]`) does not split one process's lines into two series
        rank = None if parsed.attrs.get("rank_from_message") else parsed.rank
        key = (job, parsed.host, rank)
        series = self._series(*key) if create else self.series.get(key)
        if series is None:
            return None
        body = batch.lines[index].decode("utf-8", "replace")
        seq = batch.first_seq + index
        return series, numbers, _Where(body, seq, batch.stream, ts, parsed.pid, numbers.format)

    def _catch_up(self, job: str) -> None:
        """The lines the sample left unread at the end of a log: where each series stopped
        (its last step, time and line) becomes exact; the detectors judged the sample."""
        for skip, batch in self.tail.batches(job):
            for index in _lines_with_literals(batch, skip):
                if index in batch.read:
                    continue
                read = self._read(job, batch, index, create=False)
                if read is None:
                    continue
                series, numbers, where = read
                if series.last is not None and where.seq < series.last.seq:
                    continue
                if numbers.step is not None and numbers.step >= (series.last_step or 0):
                    series.last_step = numbers.step
                series.total_steps = numbers.total_steps or series.total_steps
                series.last = where
                if where.ts_ns is not None:
                    series.times.append(where.ts_ns)

    def _saw(self, job: str, ts: int | None) -> None:
        if ts is not None and ts > self.latest_ns.get(job, ts - 1):
            self.latest_ns[job] = ts

    def _series(self, job: str, host: str | None, rank: int | None) -> _Series | None:
        series = self.series.get((job, host, rank))
        if series is None and len(self.series) < MAX_SERIES:
            series = self.series[(job, host, rank)] = self._fresh(job, host, rank)
        return series

    def _fresh(self, job: str, host: str | None, rank: int | None) -> _Series:
        return _Series(
            job,
            host,
            rank,
            LossSpikeDetector(self.loss),
            NonFiniteLoss(self.loss),
            LossScaleTracker(self.loss_scale),
        )

    def _judge(self, series: _Series, n: StepNumbers, where: _Where) -> list[Finding]:
        if n.step is not None and series.last_step is not None and n.step < series.last_step:
            # the steps went back: the job restarted from a checkpoint; a new series
            fresh = self._fresh(series.job, series.host, series.rank)
            self.series[(series.job, series.host, series.rank)] = fresh
            series = fresh
        series.observations += 1
        step = n.step if n.step is not None else series.observations
        series.last_step = step if n.step is not None else series.last_step
        series.total_steps = n.total_steps or series.total_steps
        series.last = where
        if where.ts_ns is not None:
            series.times.append(where.ts_ns)
        found: list[Finding | None] = []
        skipped = n.skipped
        if n.skipped_total is not None:
            previous = series.skipped_total
            skipped = n.skipped_total - previous if previous is not None else n.skipped_total
            series.skipped_total = n.skipped_total
        if n.loss_scale is not None or skipped:
            found.append(series.scale.observe(step, n.loss_scale, skipped=skipped))
        if n.loss is not None:
            episode = series.nan.observe(step, n.loss, skipped=series.scale.overflowed)
            if episode is not None:
                found.append(nan_finding(episode))
            found.append(series.spikes.observe(step, n.loss))
        found.append(self._throughput(series, step, n))
        return [f for f in found if f is not None]

    def _throughput(self, series: _Series, step: int, n: StepNumbers) -> Finding | None:
        if n.step_time_s is not None:
            measure, value, unit = "step_time", n.step_time_s, "s"
        elif n.throughput is not None:
            measure, value, unit = "throughput", n.throughput, n.throughput_unit or "/s"
        else:
            return None
        if series.measure is None:
            series.measure = measure
            series.drop = ThroughputDrop(
                self.throughput, subject=series.subject, measure=measure, unit=unit
            )
        if measure != series.measure or series.drop is None or not value > 0:
            return None
        series.costs.append(value if measure == "step_time" else 1.0 / value)
        return series.drop.observe(step, value)

    # -- at the end ------------------------------------------------------------------------
    def finish(self, ends: Mapping[str, int | None] | None = None) -> list[Evidence]:
        """What only the whole log shows: a NaN that never recovered, steps that stopped
        before the log ended, ranks slower than their peers. `ends`: per stream, the time of
        its last line. Once; later calls return []."""
        if self._finished:
            return []
        self._finished = True
        for stream, ts in (ends or {}).items():
            self._saw(_job(stream), ts)
        for job in sorted({s.job for s in self.series.values()}):
            self._catch_up(job)
        found: list[Evidence] = []
        for series in self.series.values():
            episode = series.nan.finish()
            if episode is not None and series.last is not None:
                found.append(self._evidence(series, nan_finding(episode), series.last))
        for job in sorted({s.job for s in self.series.values()}):
            of_job = [s for s in self.series.values() if s.job == job]
            found.extend(self._stalls(of_job))
            found.extend(self._stragglers(of_job))
        return found

    def _stalls(self, series_of_job: list[_Series]) -> list[Evidence]:
        latest = self.latest_ns.get(series_of_job[0].job) if series_of_job else None
        if latest is None:
            return []
        timed = [s for s in series_of_job if len(s.times) >= MIN_TIMED_OBSERVATIONS]
        gaps: dict[int, float] = {}
        for index, series in enumerate(timed):
            intervals = [(b - a) / 1e9 for a, b in itertools.pairwise(series.times)]
            deadline = max(
                self.progress.log_hang_floor_s,
                self.progress.hang_ratio * median(intervals) if intervals else 0.0,
            )
            gap = (latest - series.times[-1]) / 1e9
            if gap > deadline:
                gaps[index] = gap
        if not gaps:
            return []
        going_on = len(gaps) < len(timed)
        found = []
        for index, gap in gaps.items():
            series = timed[index]
            assert series.last is not None
            stopped_early = series.total_steps is not None and (series.last_step or 0) < (
                series.total_steps
            )
            found.append(
                self._evidence(
                    series, self._stall(series, gap, going_on, stopped_early), series.last
                )
            )
        return found

    def _stall(self, series: _Series, gap: float, going_on: bool, early: bool) -> Finding:
        step = series.last_step if series.last_step is not None else series.observations
        captures = {"step": str(step), "seconds": f"{gap:.1f}"}
        values: dict[str, Any] = {"subject": series.subject, "gap_s": gap}
        if not (going_on or early):
            return Finding("train.hang.no_step_before_end", captures=captures, values=values)
        if early:
            values["why"] = f"short of its last step {series.total_steps}"
            captures["total_steps"] = str(series.total_steps)
        if going_on:
            values["why"] = "while other ranks went on"
        return Finding("train.hang.progress_stopped", captures=captures, values=values)

    def _stragglers(self, series_of_job: list[_Series]) -> list[Evidence]:
        window = max(1, self.progress.straggler_window)
        ranked = [s for s in series_of_job if s.rank is not None and s.costs]
        measures = {s.measure for s in ranked}
        if len(ranked) < 2 or len(measures) != 1:
            return []
        costs = {s.rank: median(list(s.costs)[-window:]) for s in ranked if s.rank is not None}
        step_time = measures == {"step_time"}
        min_diff = self.progress.straggler_min_s if step_time else 0.0
        found = []
        by_rank = {s.rank: s for s in ranked}
        for slow in slower_than_peers(costs, self.progress.straggler_ratio, min_diff):
            series = by_rank[slow.member]
            assert series.last is not None
            ratio = slow.value / slow.peers_median if slow.peers_median > 0 else math.inf
            if step_time:
                pace = f"its steps take {fmt(slow.value)} s"
                peers_pace = f"{fmt(slow.peers_median)} s"
            else:  # the costs are 1 / throughput
                unit = series.drop.unit if series.drop is not None else "/s"
                pace = f"its throughput is {fmt(1 / slow.value)} {unit}"
                peers_pace = f"{fmt(1 / slow.peers_median)} {unit}"
            finding = Finding(
                "train.straggler.step_time",
                captures={"ratio": f"{ratio:.3f}", "step": str(series.last_step or "")},
                values={"pace": pace, "peers_pace": peers_pace, "above_pct": (ratio - 1) * 100},
            )
            found.append(self._evidence(series, finding, series.last))
        return found

    # -- evidence --------------------------------------------------------------------------
    def _evidence(self, series: _Series, finding: Finding, where: _Where) -> Evidence:
        captures: dict[str, str] = dict(finding.captures)
        if series.rank is not None:
            captures["rank"] = str(series.rank)
        attrs: dict[str, Any] = {"stream": where.stream, "detector": "series", "format": where.fmt}
        event = Event(
            body=where.body,
            ts_ns=where.ts_ns,
            host=series.host,
            source="log",
            rank=series.rank,
            pid=where.pid,
            attrs=attrs,
            seq=where.seq,
        )
        return detector_evidence(
            event,
            finding.signature,
            captures=captures,
            values=finding.values,
            severity=finding.severity,
            action=finding.action,
        )
