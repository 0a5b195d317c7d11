"""Guards: blast radius max(N, P %) within the window, the unhealthy stop, no cordon for a
fleet-wide incident, rate limits, lemons and diagnostics before resume."""

from __future__ import annotations

from denpex.remediation import guards as g
from denpex.remediation.backend import Target, TargetKind
from denpex.remediation.machine import plan_steps
from denpex.remediation.plan import Plan
from denpex.remediation.policy import default_policy, parse_policy

S = 10**9
NOW = 1_800_000_000 * S
GUARDS = default_policy().guards


def plan(actions: tuple[str, ...]) -> Plan:
    target = Target(TargetKind.HOST, "n1", None, "gpu")
    return Plan(1, "gpu.fallen_off_bus", "fleet_wide", target, actions, plan_steps(actions), "")


def test_blast_radius_is_max_of_nodes_and_percent_in_the_window() -> None:
    assert g.blast_radius_limit(3, GUARDS) == 1  # 50 % of 3 floors to 1 = N
    assert g.blast_radius_limit(10, GUARDS) == 5
    pool = g.PoolView("gpu", 10, 0, [NOW - 10 * S] * 4)
    assert g.blast_radius(pool, NOW, GUARDS) is None  # 4 < 5
    pool = g.PoolView("gpu", 10, 0, [NOW - 10 * S] * 5)
    assert "blast radius: 5 of 10" in (g.blast_radius(pool, NOW, GUARDS) or "")
    old = g.PoolView("gpu", 10, 0, [NOW - 301 * S] * 9)  # outside the 5 min window
    assert g.blast_radius(old, NOW, GUARDS) is None


def test_unhealthy_share_trips_the_stop() -> None:
    assert g.unhealthy_stop(g.PoolView("gpu", 10, 1, []), GUARDS) is None
    assert "automatic repair stopped" in (
        g.unhealthy_stop(g.PoolView("gpu", 10, 2, []), GUARDS) or ""
    )
    assert g.unhealthy_stop(g.PoolView("gpu", 0, 0, []), GUARDS) is None


def test_fleet_wide_incidents_never_cordon() -> None:
    assert "never cordons" in (g.never_cordon(plan(("drain_node",)), "fleet_wide", GUARDS) or "")
    assert g.never_cordon(plan(("drain_node",)), "job_root_cause", GUARDS) is None
    assert g.never_cordon(plan(("retry_job",)), "fleet_wide", GUARDS) is None  # no cordon


def test_rate_limits_say_how_long_to_wait() -> None:
    guards = parse_policy(
        {"guards": {"rate_limits": {"slurm": {"operations": 2, "window_s": 60}}}}
    ).guards
    assert g.rate_limited("slurm", [NOW - 50 * S], NOW, guards) == 0.0
    wait = g.rate_limited("slurm", [NOW - 50 * S, NOW - 20 * S], NOW, guards)
    assert abs(wait - 10.0) < 1e-6
    assert g.rate_limited("kubernetes", [NOW] * 100, NOW, guards) == 0.0  # no limit named


def test_lemons_and_resume() -> None:
    assert g.is_lemon([NOW - S, NOW - 2 * S, NOW - 3 * S], NOW, GUARDS)
    assert not g.is_lemon([NOW - S, NOW - 8 * 86400 * S, NOW - 3 * S], NOW, GUARDS)
    assert g.may_resume(True) is None and g.may_resume(False)
