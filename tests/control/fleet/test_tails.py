"""The tail probabilities the fleet rules score with, against values from scipy.stats."""

from __future__ import annotations

import math

import pytest

from denpex.control.fleet.tails import binomial_sf, hypergeom_sf, poisson_sf, surprise

# (function, arguments, scipy's value: poisson.sf(k-1, mu), binom.sf(k-1, n, p),
# hypergeom.sf(k-1, M, n, N))
CASES = [
    (poisson_sf, (3, 0.4), 0.007926331867253838),
    (poisson_sf, (50, 1.0), 1.2337508979097585e-65),
    (poisson_sf, (5, 5.0), 0.5595067149347879),
    (poisson_sf, (200, 150.0), 5.709688574208249e-05),
    (binomial_sf, (20, 25, 0.3), 3.457444079591644e-07),
    (hypergeom_sf, (5, 512, 20, 16), 0.00017874482527139579),
]


@pytest.mark.parametrize("function,args,expected", CASES)
def test_tails_match_scipy(function, args, expected):
    assert math.isclose(function(*args), expected, rel_tol=1e-9)


def test_edges():
    assert poisson_sf(0, 3.0) == 1.0 and poisson_sf(2, 0.0) == 0.0
    assert binomial_sf(5, 4, 0.5) == 0.0 and binomial_sf(3, 4, 1.0) == 1.0
    assert hypergeom_sf(6, 100, 5, 50) == 0.0
    assert surprise(1e-3) == pytest.approx(3.0) and surprise(0.0) == 300.0
