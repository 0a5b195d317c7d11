"""Policy tiers as data: the most specific tier wins, bad policies are refused, and each
tier decides run / wait / record for reversible and irreversible steps."""

from __future__ import annotations

import pytest

from denpex.remediation.machine import State
from denpex.remediation.policy import (
    Decision,
    PolicyError,
    Tier,
    decide,
    default_policy,
    parse_policy,
    tier_explanations,
)


def test_default_is_observe_and_every_tier_is_explained() -> None:
    assert default_policy().tier is Tier.OBSERVE
    assert set(tier_explanations()) == {str(t) for t in Tier}


def test_most_specific_tier_wins() -> None:
    policy = parse_policy(
        {
            "tier": "recommend",
            "pools": {"gpu": "approve"},
            "categories": {"gpu.fallen_off_bus": "autosafe", "net.link_down": "approve"},
            "pool_categories": {"gpu/net.link_down": "observe"},
        }
    )
    assert policy.tier_for(None, "cuda.oom") is Tier.RECOMMEND
    assert policy.tier_for("gpu", "cuda.oom") is Tier.APPROVE
    assert policy.tier_for("gpu", "gpu.fallen_off_bus") is Tier.AUTOSAFE
    assert policy.tier_for("cpu", "net.link_down") is Tier.APPROVE
    assert policy.tier_for("gpu", "net.link_down") is Tier.OBSERVE
    # guards not given keep their defaults
    assert policy.guards.blast_radius.max_percent == 50
    assert policy.digest() != default_policy().digest()


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"tier": "yolo"}, "unknown tier"),
        ({"categories": {"gpu.melted": "approve"}}, "unknown category"),
        ({"pool_categories": {"gpu.fallen_off_bus": "approve"}}, "POOL/CATEGORY"),
        ({"colour": "red"}, "unknown policy settings"),
        ({"guards": {"blast_radius": {"max_nodes": 1}}}, "malformed"),
        ({"guards": {"speed": 1}}, "unknown guard"),
    ],
)
def test_bad_policies_are_refused(bad: dict, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        parse_policy(bad)


@pytest.mark.parametrize(
    "tier, reversible, irreversible",
    [
        (Tier.OBSERVE, Decision.RECORD, Decision.RECORD),
        (Tier.RECOMMEND, Decision.RECORD, Decision.RECORD),
        (Tier.APPROVE, Decision.WAIT, Decision.WAIT),
        (Tier.AUTOSAFE, Decision.RUN, Decision.WAIT),
        (Tier.AUTOREMEDIATE, Decision.RUN, Decision.RUN),
    ],
)
def test_tiers_decide(tier: Tier, reversible: Decision, irreversible: Decision) -> None:
    assert decide(tier, State.CORDON, approved=False) is reversible
    assert decide(tier, State.EVICT, approved=False) is irreversible
    if tier in (Tier.APPROVE, Tier.AUTOSAFE):
        assert decide(tier, State.EVICT, approved=True) is Decision.RUN
    if tier is Tier.OBSERVE:  # an approval does not lift a record-only tier
        assert decide(tier, State.CORDON, approved=True) is Decision.RECORD
