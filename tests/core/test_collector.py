"""The collector base's EdgeTrigger: what every collector uses to report a lasting condition
once, and again only after it cleared."""

from __future__ import annotations

from denpex.core.collector import EdgeTrigger


def test_rising_reports_once_per_episode() -> None:
    edges = EdgeTrigger()
    seen = [edges.rising(("/job", "memory"), c) for c in (False, True, True, False, True)]
    assert seen == [False, True, False, False, True]


def test_first_is_once_until_cleared_and_keys_are_independent() -> None:
    edges = EdgeTrigger()
    assert edges.first(("missing", "/ckpt")) and not edges.first(("missing", "/ckpt"))
    assert edges.first(("missing", "/scratch"))
    edges.clear(("missing", "/ckpt"))
    assert edges.first(("missing", "/ckpt"))


def test_holding_returns_new_conditions_and_rearms_the_ones_that_stopped() -> None:
    edges = EdgeTrigger()
    assert edges.first(("note", 1))
    assert edges.holding("gpu0", {"thermal", "remap"}) == {"thermal", "remap"}
    assert edges.holding("gpu0", {"thermal"}) == set()
    assert edges.holding("gpu1", {"thermal"}) == {"thermal"}  # another group, its own state
    assert edges.holding("gpu0", {"thermal", "remap"}) == {"remap"}  # remap cleared, is back
    assert not edges.first(("note", 1))  # groups never touch other keys


def test_retain_forgets_subjects_that_are_gone() -> None:
    edges = EdgeTrigger()
    edges.rising((100, "fds"), True)
    edges.rising((200, "fds"), True)
    edges.retain(lambda key: key[0] == 100)
    assert not edges.rising((100, "fds"), True) and edges.rising((200, "fds"), True)
