"""The guards that stop automatic remediation before it does harm (DESIGN §7): the blast
radius of a pool within a window, the unhealthy-share stop that only a human resets, no
cordon for a fleet-wide incident, per-backend rate limits, lemon hosts to RMA, and no return
to service without passed diagnostics.

Pure: counts and timestamps in, a reason (or None) out; the executor reads the counts from
the store and the backend. It must never let a guard's refusal be overridden by a tier:
only a named human's approval of the held step, or a reset, lets it pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from denpex.remediation.machine import State
from denpex.remediation.plan import Plan
from denpex.remediation.policy import Guards, RateLimit


@dataclass(frozen=True, slots=True)
class PoolView:
    """What the executor knows of a pool when a step is about to run."""

    name: str | None
    size: int  # nodes in the pool (the backend's count)
    unhealthy: int  # nodes cordoned, drained or down
    cordons_ns: Sequence[int]  # times of our cordons in this pool (recent ones suffice)


def never_cordon(plan: Plan, rule: str, guards: Guards) -> str | None:
    """A fleet-wide incident's plan may not cordon hosts (it would drain the fleet)."""
    if rule in guards.never_cordon_rules and State.CORDON in plan.steps:
        return (
            f"incident rule {rule!r} is fleet-wide: denpex never cordons hosts for it "
            "(fix the shared cause: a driver rollout, a switch, a filesystem)"
        )
    return None


def blast_radius_limit(pool_size: int, guards: Guards) -> int:
    """Cordons allowed in one window: max(N nodes, P % of the pool)."""
    br = guards.blast_radius
    return max(br.max_nodes, math.floor(pool_size * br.max_percent / 100.0))


def blast_radius(pool: PoolView, now_ns: int, guards: Guards) -> str | None:
    """Refuse one more cordon in `pool` when the window already holds the limit."""
    window_ns = guards.blast_radius.window_s * 1e9
    recent = sum(1 for t in pool.cordons_ns if now_ns - t < window_ns)
    limit = blast_radius_limit(pool.size, guards)
    if recent >= limit:
        return (
            f"blast radius: {recent} of {pool.size} nodes of pool {pool.name or '-'} cordoned "
            f"in the last {guards.blast_radius.window_s:g} s (limit {limit})"
        )
    return None


def unhealthy_stop(pool: PoolView, guards: Guards) -> str | None:
    """Trip the pool's stop when its unhealthy share reaches the limit (a human resets it)."""
    if pool.size <= 0:
        return None
    share = 100.0 * pool.unhealthy / pool.size
    if share >= guards.unhealthy_stop_percent:
        return (
            f"{pool.unhealthy} of {pool.size} nodes of pool {pool.name or '-'} unhealthy "
            f"({share:.0f} % >= {guards.unhealthy_stop_percent:g} %): automatic repair stopped "
            "until a human resets the guard"
        )
    return None


def rate_limited(backend: str, ops_ns: Sequence[int], now_ns: int, guards: Guards) -> float:
    """Seconds until the backend's rate limit admits one more operation (0: now)."""
    limit: RateLimit | None = guards.rate_limits.get(backend)
    if limit is None:
        return 0.0
    window_ns = limit.window_s * 1e9
    recent = sorted(t for t in ops_ns if now_ns - t < window_ns)
    if len(recent) < limit.operations:
        return 0.0
    oldest_counted = recent[len(recent) - limit.operations]
    return max(0.0, (oldest_counted + window_ns - now_ns) / 1e9)


def is_lemon(incidents_ns: Sequence[int], now_ns: int, guards: Guards) -> bool:
    """A host with guards.lemon_incidents incidents or more within the window."""
    window_ns = guards.lemon_window_s * 1e9
    return sum(1 for t in incidents_ns if now_ns - t < window_ns) >= guards.lemon_incidents


def may_resume(diagnostics_passed: bool) -> str | None:
    """A host returns to service only after its diagnostics passed."""
    return None if diagnostics_passed else "diagnostics have not passed on this host"
