"""Orders evidence on one timeline and picks the few lines that prove a diagnosis.

Evidence with wall-clock times is ordered by time; evidence without (plain logs) keeps its
arrival order relative to its neighbours. Pure functions over Evidence; no I/O.
"""

from __future__ import annotations

from functools import cmp_to_key

from denpex.core.events import Evidence


def _compare(a: Evidence, b: Evidence) -> int:
    ta, tb = a.event.ts_ns, b.event.ts_ns
    if ta is not None and tb is not None and ta != tb:
        return -1 if ta < tb else 1
    sa, sb = a.event.seq, b.event.seq
    return (sa > sb) - (sa < sb)


order_key = cmp_to_key(_compare)


def line_key(item: Evidence) -> tuple[object, ...]:
    """Which input line `item` matched on (derived evidence is a line of its own)."""
    if item.event.attrs.get("derived"):
        return ("derived", item.id)
    return (item.event.attrs.get("stream"), item.event.source, item.event.seq)


def ordered(evidence: list[Evidence]) -> list[Evidence]:
    """Evidence in timeline order (deterministic for the same input)."""
    return sorted(evidence, key=order_key)


def earliest(evidence: list[Evidence]) -> Evidence | None:
    return min(evidence, key=order_key) if evidence else None


def before(a: Evidence, b: Evidence) -> bool:
    return _compare(a, b) < 0


def seconds_between(a: Evidence, b: Evidence) -> float | None:
    """b minus a in seconds, when both carry a time of their own (an inherited time, taken
    from an earlier line, only bounds the real one from below)."""
    if a.event.ts_ns is None or b.event.ts_ns is None:
        return None
    if a.event.attrs.get("ts_inherited") or b.event.attrs.get("ts_inherited"):
        return None
    return (b.event.ts_ns - a.event.ts_ns) / 1e9


def pick_timeline(
    root: list[Evidence],
    others: list[Evidence],
    *,
    max_lines: int,
    root_lines: int,
    must: list[Evidence] | None = None,
) -> list[Evidence]:
    """The lines that prove a diagnosis: the root cause's first lines (from distinct sources
    first), the lines in `must` (further findings, host context), then the first line of each
    other category, in time order. One input line is one row, whatever matched on it."""
    chosen: list[Evidence] = []
    lines: set[tuple[object, ...]] = set()

    def take(item: Evidence) -> bool:
        key = line_key(item)
        if key in lines:
            return False
        lines.add(key)
        chosen.append(item)
        return True

    seen_sources: set[str] = set()
    for item in ordered(root):
        if len(chosen) >= root_lines:
            break
        if item.event.source not in seen_sources and take(item):
            seen_sources.add(item.event.source)
    for item in ordered(root):
        if len(chosen) >= root_lines:
            break
        if item not in chosen:
            take(item)
    for item in ordered(must or []):
        if len(chosen) >= max_lines:
            break
        take(item)
    seen_keys: set[tuple[str, object, object]] = {(e.category, None, None) for e in must or []}
    for item in ordered(others):
        if len(chosen) >= max_lines:
            break
        key = (item.category, item.event.host, item.event.rank if len(seen_keys) < 3 else None)
        if key in seen_keys or (item.category, None, None) in seen_keys:
            continue
        if take(item):
            seen_keys.add(key)
    return ordered(chosen)
