"""The fleet rules (DESIGN §6), each a small named function over a FleetContext.

A rule returns the candidates it found and marks the strikes it explained, so that a lower
rule never blames a host for what a higher one pinned on a shared cause. Thresholds come
from rules.yaml; rules never do I/O and never read the clock.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import replace

from denpex.control.fleet.config import lookup_by_pattern
from denpex.control.fleet.context import FleetContext
from denpex.control.fleet.model import TOPOLOGY_KINDS, EvidenceRecord, IncidentCandidate, gpu_id
from denpex.control.fleet.strikes import Strike, normal_pci
from denpex.control.fleet.tails import binomial_sf, hypergeom_sf, poisson_sf, surprise
from denpex.core.events import format_ts

_NS = 1_000_000_000


def _ts(ns: int) -> str:
    return format_ts(ns) or "?"


def _best_label(ctx: FleetContext, items: list[Strike]) -> tuple[str, str, int, float] | None:
    """The dependency label (key, value, strikes with it, binomial p) that best sets the
    strikes apart from the fleet, if one covers enough of them and few enough hosts."""
    cfg = ctx.config["fleet_wide"]
    counts: Counter[tuple[str, str]] = Counter()
    for strike in items:
        for key, value in ctx.labels_of(strike).items():
            if key in cfg["label_kinds"]:
                counts[(key, value)] += 1
    best = None
    n = len(items)
    for (key, value), k in sorted(counts.items()):
        share = ctx.fleet_share(key, value)
        if k / n < float(cfg["label_coverage"]) or share > float(cfg["label_max_fleet_share"]):
            continue
        if share and k / n < float(cfg["label_min_enrichment"]) * share:
            continue  # the failures carry it about as often as everything else does
        p = binomial_sf(k, n, share)
        if best is None or p < best[3]:
            best = (key, value, k, p)
    return best


def _spread_ok(ctx: FleetContext, hosts: set[str]) -> bool:
    cfg = ctx.config["fleet_wide"]
    places, top_share = ctx.spread(hosts)
    return places >= int(cfg["min_switches"]) and top_share <= float(cfg["max_component_share"])


def fleet_wide(ctx: FleetContext) -> list[IncidentCandidate]:
    """The same failure on many unrelated hosts is a shared dependency: the driver or image
    label that sets those hosts apart (a rollout), else — for a burst within minutes — the
    dependency its category names (filesystem, scheduler). Never the hosts."""
    cfg = ctx.config["fleet_wide"]
    by_category: dict[str, list[Strike]] = defaultdict(list)
    for strike in ctx.open_strikes():
        if strike.host and strike.job is not None:
            by_category[strike.category].append(strike)
    out = []
    for category, items in sorted(by_category.items()):
        hosts = {s.host for s in items if s.host}
        if len(hosts) < int(cfg["min_hosts"]) or not _spread_ok(ctx, hosts):
            continue
        label = _best_label(ctx, items)
        if label is not None and label[3] <= float(cfg["max_p_value"]):
            key, value, k, p = label
            matched = [s for s in items if ctx.labels_of(s).get(key) == value]
            share = ctx.fleet_share(key, value)
            text = (
                f"{category} failed {len(matched)} jobs on {len({s.host for s in matched})} hosts "
                f"behind many switches; {k} of {len(items)} ran with {key}={value}, which "
                f"{share:.0%} of the fleet has: a shared dependency, not the hosts"
            )
            out.append(
                ctx.candidate(
                    "fleet_wide",
                    cfg["label_kinds"][key],
                    f"{key}={value}",
                    surprise(p),
                    matched,
                    text,
                    category=category,
                )
            )
            ctx.consume(matched)
            continue
        burst = _burst(ctx, items)
        if burst is not None:
            window, p = burst
            kind = lookup_by_pattern(cfg["category_kinds"], category, "dependency")
            text = (
                f"{category} failed {len(window)} jobs on {len({s.host for s in window})} "
                f"unrelated hosts between {_ts(window[0].ts_ns)} and {_ts(window[-1].ts_ns)}: "
                f"a shared {kind} fault, not the hosts"
            )
            out.append(ctx.candidate("fleet_wide", kind, category, surprise(p), window, text))
            ctx.consume(window)
    return out


def _burst(ctx: FleetContext, items: list[Strike]) -> tuple[list[Strike], float] | None:
    """The burst window with the most hosts, if it has enough hosts, workloads and spread
    (two pointers over the strikes, in time order)."""
    cfg = ctx.config["fleet_wide"]
    width = int(float(cfg["burst_window_s"]) * _NS)
    hosts: Counter[str | None] = Counter()
    best: tuple[int, int, int] = (0, 0, 0)  # (distinct hosts, start, end)
    end = 0
    for start, first in enumerate(items):
        while end < len(items) and items[end].ts_ns - first.ts_ns <= width:
            hosts[items[end].host] += 1
            end += 1
        if len(hosts) > best[0]:
            best = (len(hosts), start, end)
        hosts[first.host] -= 1
        if not hosts[first.host]:
            del hosts[first.host]
    window = items[best[1] : best[2]]
    burst_hosts = {s.host for s in window if s.host}
    if len(burst_hosts) < int(cfg["burst_min_hosts"]):
        return None
    if len({s.workload for s in window}) < int(cfg["burst_min_workloads"]):
        return None
    if not _spread_ok(ctx, burst_hosts):
        return None
    rate = len(items) / max(1.0, ctx.config.lookback_ns / width)
    return window, poisson_sf(len(window), rate)


def shared_component(ctx: FleetContext) -> list[IncidentCandidate]:
    """Failures clustered behind one switch / rail / PDU / rack / pool, far beyond what the
    window's failures fleet-wide would put there by chance (hypergeometric tail). The most
    telling cluster goes first and explains its strikes; the rest are tested again without
    them, so a rail or rack around the same failures names nothing of its own."""
    cfg = ctx.config["shared_component"]
    width = int(float(cfg["window_s"]) * _NS)
    out: list[IncidentCandidate] = []
    affected = {kind: _affected(ctx, kind) for kind in TOPOLOGY_KINDS}
    while True:
        for kind, items in affected.items():  # drop what the last cluster explained
            affected[kind] = [
                it
                for it in items
                if (it[3] is None or id(it[3]) not in ctx.consumed)
                and (it[4] is None or it[4].id not in ctx.consumed_warnings)
            ]
        best = _best_cluster(ctx, width, affected)
        if best is None or best[0] > float(cfg["max_p_value"]):
            return out
        p, kind, component, inside, units, items = best
        strikes = [it[3] for it in inside if it[3] is not None]
        warns = [it[4] for it in inside if it[4] is not None]
        # everything of its kind the component saw in the lookback is its doing
        explained = list(
            {id(it[3]): it[3] for it in items if it[1] == component and it[3] is not None}.values()
        )
        hit = {s.host for s in strikes} | {w.host for w in warns}
        noun = "GPUs on" if kind == "rail" else "hosts behind"
        text = (
            f"{len(strikes)} failed jobs and {len(warns)} warnings on {len(hit)} of the "
            f"{len(units)} {noun} {kind} {component} within {cfg['window_s'] / 3600:g} h "
            f"(p={p:.1e} by chance): the {kind}, not the hosts"
        )
        out.append(
            ctx.candidate(
                "shared_component", kind, component, surprise(p), explained, text, warnings=warns
            )
        )
        ctx.consume(explained)
        ctx.consume_warnings(warns)


def _best_cluster(ctx: FleetContext, width: int, affected: dict[str, list[tuple]]) -> tuple | None:
    """(p, kind, component, items in its window, its units, all items of its kind) of the
    least likely cluster over every component and window, or None."""
    cfg = ctx.config["shared_component"]
    min_hosts, min_jobs = int(cfg["min_hosts"]), int(cfg["min_jobs"])
    best = None
    for kind in TOPOLOGY_KINDS:
        members = ctx.members(kind)
        items = affected[kind]
        if not members or not items:
            continue
        population = ctx.population(kind)
        times = [it[0] for it in items]
        by_component: dict[str, list[tuple]] = defaultdict(list)
        for it in items:
            by_component[it[1]].append(it)
        for component, mine in sorted(by_component.items()):
            units = members.get(component, set())
            if not units or len(units) / population > float(cfg["max_member_share"]):
                continue
            if len({it[2] for it in mine}) < min_hosts:
                continue
            for drawn, inside in _windows(mine, items, times, width, min_hosts, min_jobs):
                p = hypergeom_sf(len({it[5] for it in inside}), population, len(units), drawn)
                if best is None or p < best[0]:
                    best = (p, kind, component, inside, units, items)
    return best


def _windows(
    mine: list[tuple],
    items: list[tuple],
    times: list[int],
    width: int,
    min_hosts: int,
    min_jobs: int,
):
    """For each window of `width` that opens at one of a component's items and holds enough
    hosts and failed jobs: (units hit fleet-wide in that window, the component's items in
    it). Two pointers over the component's items, in time order."""
    hosts: Counter[str] = Counter()
    jobs: Counter[str] = Counter()
    end = 0
    for start, anchor in enumerate(mine):
        while end < len(mine) and mine[end][0] <= anchor[0] + width:
            hosts[mine[end][2]] += 1
            if mine[end][3] is not None and mine[end][3].job is not None:
                jobs[mine[end][3].job.job] += 1
            end += 1
        if len(hosts) >= min_hosts and len(jobs) >= min_jobs:
            lo = bisect.bisect_left(times, anchor[0])
            hi = bisect.bisect_right(times, anchor[0] + width)
            yield len({it[5] for it in items[lo:hi]}), mine[start:end]
        hosts[anchor[2]] -= 1
        if not hosts[anchor[2]]:
            del hosts[anchor[2]]
        if anchor[3] is not None and anchor[3].job is not None:
            jobs[anchor[3].job.job] -= 1
            if not jobs[anchor[3].job.job]:
                del jobs[anchor[3].job.job]


def _affected(ctx: FleetContext, kind: str) -> list[tuple]:
    """(time, component, host, strike or None, warning or None, unit) for every open strike
    and warning a component of `kind` can cause, in time order."""
    items: list[tuple] = []
    accepts = ctx.config.component_accepts
    for strike in ctx.open_strikes():
        if accepts(kind, strike.category):
            pci = strike.gpu.pci if strike.gpu else None
            for component, unit in ctx.units_of(kind, strike.host, pci):
                items.append((strike.ts_ns, component, strike.host, strike, None, unit))
    for warning in ctx.open_warnings():
        if warning.ts_ns is not None and accepts(kind, warning.category):
            for component, unit in ctx.units_of(kind, warning.host, warning.gpu_pci):
                items.append((warning.ts_ns, component, warning.host, None, warning, unit))
    items.sort(key=lambda it: (it[0], it[1], it[2] or ""))
    return items


def _component_of(strike: Strike) -> tuple[str, str]:
    if strike.gpu is not None:
        return ("gpu", gpu_id(strike.gpu))
    return ("host", strike.host or "?")


def hardware_in_job(ctx: FleetContext) -> list[IncidentCandidate]:
    """GPU, fabric or host hardware named as a job's root cause once its host events are
    joined in (or an agent's error on idle hardware): that GPU, else that host — once its
    episodes reach the category's count (rules.yaml min_strikes)."""
    cfg = ctx.config["hardware_in_job"]
    since = ctx.now_ns - int(float(cfg["window_s"]) * _NS)
    episode = int(float(cfg["episode_s"]) * _NS)
    groups: dict[tuple[str, str], list[Strike]] = defaultdict(list)
    for strike in ctx.open_strikes():
        if strike.hardware and strike.host and strike.ts_ns >= since and ctx.after_recovery(strike):
            groups[_component_of(strike)].append(strike)
    _attach_to_the_one_gpu(groups)
    out = []
    for (kind, component), strikes in sorted(groups.items()):
        weight, last = 0.0, None
        for strike in strikes:
            if last is not None and strike.ts_ns - last < episode:
                continue  # the same episode: an Xid and the job it killed count once
            last = strike.ts_ns
            need = lookup_by_pattern(
                cfg["min_strikes"], strike.category, cfg["min_strikes"]["default"]
            )
            weight += 1 / float(need)
        if weight < 1 - 1e-9:
            continue
        hosts = {s.host for s in strikes if s.host}
        cited = {i for s in strikes for i in s.evidence}
        warns = ctx.warnings_on(hosts, strikes[0].ts_ns - ctx.config.lookback_ns, ctx.now_ns)
        warns = [
            w
            for w in warns
            if w.id not in cited and (kind == "host" or not w.gpu_pci or _same_gpu(w, strikes[0]))
        ]
        score = weight + (0.5 if warns else 0.0)
        cats = ", ".join(sorted({s.category for s in strikes}))
        jobs = len({s.job.job for s in strikes if s.job is not None})
        text = (
            f"{kind} {component} on {', '.join(sorted(hosts))}: {cats} "
            f"({len(strikes)} times, {jobs} failed jobs since {_ts(strikes[0].ts_ns)})"
        )
        out.append(
            ctx.candidate("hardware_in_job", kind, component, score, strikes, text, warnings=warns)
        )
        ctx.consume(strikes)
    return out


def _attach_to_the_one_gpu(groups: dict[tuple[str, str], list[Strike]]) -> None:
    """A host's GPU-category strikes that name no GPU (a job whose report gives no GPU
    placement) belong to the host's GPU with strikes of its own, when there is just one."""
    gpus_of: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key, strikes in groups.items():
        if key[0] == "gpu" and strikes[0].host:
            gpus_of[strikes[0].host].append(key)
    for key in [k for k in groups if k[0] == "host"]:
        owners = gpus_of.get(key[1], [])
        if len(owners) != 1:
            continue
        moving = [s for s in groups[key] if s.category.startswith("gpu.")]
        if not moving:
            continue
        groups[owners[0]] = sorted(groups[owners[0]] + moving, key=lambda s: s.ts_ns)
        groups[key] = [s for s in groups[key] if not s.category.startswith("gpu.")]
        if not groups[key]:
            del groups[key]


def _same_gpu(warning: EvidenceRecord, strike: Strike) -> bool:
    return strike.gpu is not None and normal_pci(warning.gpu_pci) == strike.gpu.pci


def repeat_offender(ctx: FleetContext) -> list[IncidentCandidate]:
    """The same host in several failed jobs of different workloads within the window, far
    above the fleet's rate for its share of jobs (Poisson tail), even when every job's own
    diagnosis looked like software; its GPU when most of them name one GPU."""
    cfg = ctx.config["repeat_offender"]
    since = ctx.now_ns - int(float(cfg["window_s"]) * _NS)
    counted = [
        s
        for s in ctx.open_strikes()
        if s.job is not None and s.host and s.ts_ns >= since and ctx.implicating(s)
    ]
    host_jobs = sum(ctx.host_jobs.values())
    rate = len(counted) / host_jobs if host_jobs else 0.0
    by_host: dict[str, list[Strike]] = defaultdict(list)
    for strike in counted:
        if ctx.after_recovery(strike):
            by_host[strike.host].append(strike)  # type: ignore[index]
    out = []
    for host, strikes in sorted(by_host.items()):
        jobs = {s.job.job for s in strikes if s.job is not None}
        workloads = {s.workload for s in strikes}
        back = int(float(cfg["corroboration_before_s"]) * _NS)
        cited = {i for s in strikes for i in s.evidence}  # a warning a strike cites is not more
        warns = [
            w
            for w in ctx.warnings_on({host}, strikes[0].ts_ns - back, ctx.now_ns)
            if w.id not in cited
        ]
        need = int(cfg["min_jobs_corroborated" if warns else "min_jobs"])
        if len(jobs) < need or len(workloads) < int(cfg["min_workloads"]):
            continue
        p = poisson_sf(len(jobs), rate * ctx.host_jobs[host])
        if warns:  # independent evidence: how often a host shows such warnings at all
            p *= _warned_share(ctx, strikes[0].ts_ns - back)
        if p > float(cfg["max_p_value"]):
            continue
        kind, component = "host", host
        gpus = Counter(gpu_id(s.gpu) for s in strikes if s.gpu is not None)
        if gpus:
            top, count = gpus.most_common(1)[0]
            enough = count >= int(cfg["min_jobs"])
            if enough and count / len(strikes) >= float(cfg["gpu_share"]):
                kind, component = "gpu", top
        cats = Counter(s.category for s in strikes)
        text = (
            f"{kind} {component} is in {len(jobs)} failed jobs of {len(workloads)} workloads "
            f"since {_ts(strikes[0].ts_ns)} ({', '.join(f'{c} ×{n}' for c, n in sorted(cats.items()))}), "
            f"{ctx.host_jobs[host]} jobs ran there (p={p:.1e} at the fleet's rate)"
            + (f"; {len(warns)} hardware warnings on it" if warns else "")
        )
        score = surprise(p)
        out.append(
            ctx.candidate("repeat_offender", kind, component, score, strikes, text, warnings=warns)
        )
        ctx.consume(strikes)
    return out


def _warned_share(ctx: FleetContext, since_ns: int) -> float:
    """The share of the fleet's hosts with corroborating warnings since `since_ns`."""
    hosts = {w.host for w in ctx.warnings if w.ts_ns is not None and w.ts_ns >= since_ns}
    return max(len(hosts), 1) / max(len(ctx.view.topology) or len(ctx.host_jobs), 1)


def job_story(ctx: FleetContext) -> list[IncidentCandidate]:
    """A job whose ranks reported apart (one report per rank or host) and that the engine,
    over all its reports and its hosts' events together, blames on one host (rules.yaml
    `job_story`: the rank its peers timed out waiting for, the host whose link went down):
    that host, for that job. No one report could say it: each rank saw only its own wait.
    Strikes a higher rule explained, and causes that are the job's own, blame nobody."""
    cfg = ctx.config["job_story"]
    decisive = set(cfg["rules"])
    out = []
    for strike in ctx.open_strikes():
        job = strike.job
        if job is None or job.reports < int(cfg["min_reports"]) or not strike.host:
            continue
        if strike.rule not in decisive or not ctx.implicating(strike):
            continue
        rank = next((r for r, h in sorted(job.ranks.items()) if h == strike.host), None)
        where = f"rank {rank} on {strike.host}" if rank is not None else strike.host
        text = (
            f"job {job.job}: {strike.category} on {where} ({strike.rule}, over the "
            f"{job.reports} reports of its {len(job.hosts)} hosts and their agents' events)"
        )
        candidate = ctx.candidate(
            "job_story", "host", strike.host, strike.confidence, [strike], text
        )
        action = lookup_by_pattern(cfg["actions"], strike.category, cfg["actions"]["default"])
        out.append(replace(candidate, action=str(action)))
        ctx.consume([strike])
    return out


def recovered(ctx: FleetContext) -> list[IncidentCandidate]:
    """A host whose diagnostics passed after its last failure and that ran enough clean
    jobs since leaves suspicion (and its GPUs with it)."""
    out = []
    for host, passed in sorted(ctx.cutoff.items()):
        mine = [s for s in ctx.strikes if s.host == host and ctx.implicating(s)]
        if not mine or any(s.ts_ns > passed for s in mine):
            continue  # nothing to recover from, or it failed again since
        clean = ctx.clean_jobs_since(host, passed)
        text = (
            f"host {host}: diagnostics passed at {_ts(passed)} after its last failure "
            f"({_ts(mine[-1].ts_ns)}) and it ran {clean} clean jobs since"
        )
        out.append(
            ctx.candidate(
                "recovered",
                "host",
                host,
                float(clean),
                [],
                text,
                category=mine[-1].category,
                verdict="recovered",
                hosts=(host,),
            )
        )
    return out


# Precedence, highest first: a shared dependency or component explains strikes before any
# host is blamed for them; a host's history (hardware_in_job, repeat_offender) before one
# job's story; `recovered` only clears.
RULES: tuple[Callable[[FleetContext], list[IncidentCandidate]], ...] = (
    fleet_wide,
    shared_component,
    hardware_in_job,
    repeat_offender,
    job_story,
    recovered,
)
