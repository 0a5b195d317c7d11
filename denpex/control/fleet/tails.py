"""Upper-tail probabilities the fleet rules score clusters with: how likely so many failures
would land where they did by chance (Poisson, binomial, hypergeometric).

Exact sums in log space over small integer counts; pure functions, no dependencies.
"""

from __future__ import annotations

import math

_FLOOR = 1e-300  # below this a tail is "impossible by chance"; -log10 of it is 300


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _sum_logs(terms: list[float]) -> float:
    if not terms:
        return 0.0
    top = max(terms)
    return math.exp(top) * sum(math.exp(t - top) for t in terms) if top > -700 else 0.0


def poisson_sf(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean)."""
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0

    def log_term(i: int) -> float:
        return -mean + i * math.log(mean) - math.lgamma(i + 1)

    if k <= mean:  # the tail holds most of the mass: one minus the few terms below it
        below = [log_term(i) for i in range(k)]
        return max(0.0, min(1.0, 1.0 - _sum_logs(below)))
    # terms fall at least geometrically past the mean: sum them until they stop counting
    terms = [log_term(k)]
    i = k + 1
    while terms[-1] - terms[0] > -40 and i < k + 10_000:
        terms.append(log_term(i))
        i += 1
    return max(0.0, min(1.0, _sum_logs(terms)))


def binomial_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [_log_comb(n, i) + i * lp + (n - i) * lq for i in range(k, n + 1)]
    return max(0.0, min(1.0, _sum_logs(terms)))


def hypergeom_sf(k: int, population: int, successes: int, draws: int) -> float:
    """P(X >= k): drawing `draws` of `population` items of which `successes` are marked."""
    if k <= 0:
        return 1.0
    high = min(successes, draws)
    if k > high:
        return 0.0
    denominator = _log_comb(population, draws)
    terms = [
        _log_comb(successes, i) + _log_comb(population - successes, draws - i) - denominator
        for i in range(k, high + 1)
        if draws - i <= population - successes
    ]
    return max(0.0, min(1.0, _sum_logs(terms)))


def surprise(p_value: float) -> float:
    """-log10 of a tail probability: 3 means one chance in a thousand."""
    return -math.log10(max(p_value, _FLOOR))
