"""Regex analysis shared by the matchers and the catalog loader: required literals, portability.

A *required literal set* is a set of byte strings of which at least one occurs in every line a
pattern matches; the prefilter keys on it. Python's own parser (`re._parser`) gives the syntax
tree; no library exposes literal extraction for Python regexes, hence this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from re import _constants as sre_c  # type: ignore[attr-defined]  # Python ≥ 3.11
from re import _parser as sre_parse  # type: ignore[attr-defined]

IGNORECASE_PREFIX = "(?i)"
_NEWLINE = ord("\n")
_MAXREPEAT = sre_c.MAXREPEAT


@dataclass(frozen=True, slots=True)
class LiteralPlan:
    """At least one of `alternatives` occurs in every matching line (lowercased if ignorecase).

    `position` is the index of the top-level item where the chosen literal starts, and
    `unbounded_before` tells whether an unbounded repeat precedes it.
    """

    alternatives: tuple[bytes, ...]
    ignorecase: bool
    position: int
    unbounded_before: bool

    @property
    def min_length(self) -> int:
        return min(len(a) for a in self.alternatives)


def split_flags(pattern: str) -> tuple[str, bool]:
    """Strip the '(?i)' prefix: (pattern body, ignorecase)."""
    if pattern.startswith(IGNORECASE_PREFIX):
        return pattern[len(IGNORECASE_PREFIX) :], True
    return pattern, False


@lru_cache(maxsize=4096)  # re's own cache holds 512: a larger catalog would compile twice
def compile_pattern(pattern: str) -> re.Pattern[bytes]:
    """Compile a catalog pattern for bytes lines; '(?i)' means ASCII case-insensitive."""
    body, ignorecase = split_flags(pattern)
    return re.compile(body.encode("utf-8"), re.IGNORECASE if ignorecase else 0)


@lru_cache(maxsize=4096)
def parse_bytes(body: str):
    """The syntax tree of the bytes that `compile_pattern` compiles (shared, never mutate it).

    Parsing the str instead would make an escape such as \\xff the two UTF-8 bytes of U+00FF
    where the compiled pattern matches the single byte 0xff."""
    return sre_parse.parse(body.encode("utf-8"))


def _parse(pattern: str):
    body, _ = split_flags(pattern)
    return parse_bytes(body)


def _run_to_bytes(chars: list[int], ignorecase: bool) -> bytes:
    data = bytes(chars)
    return data.lower() if ignorecase else data


# Words on nearly every line of training output: a prefilter keyed on them rejects nothing,
# so a shorter but rarer literal of the same pattern is preferred.
COMMON_WORDS = frozenset(
    b"loss error rank step info warn warning nccl cuda gpu node the and for with time train "
    b"epoch iter torch python file line process worker data model info".split()
)


def _score(alternatives: tuple[bytes, ...]) -> tuple[int, int]:
    def worth(literal: bytes) -> int:
        word = literal.strip().lower()
        common = any(word in common_word for common_word in COMMON_WORDS)
        too_short = len(literal) < 3  # shorter than any prefilter should key on
        return len(literal) - (8 if common else 0) - (16 if too_short else 0)

    return (min(worth(a) for a in alternatives), -len(alternatives))


def _best(candidates: list[tuple[bytes, ...]]) -> tuple[bytes, ...] | None:
    if not candidates:
        return None
    return max(candidates, key=_score)


def _items_requirements(items, ignorecase: bool) -> list[tuple[int, tuple[bytes, ...]]]:
    """All requirement sets of a sequence, each with the item index where it starts."""
    found: list[tuple[int, tuple[bytes, ...]]] = []
    run: list[int] = []
    run_start = 0
    for index, (op, av) in enumerate(items):
        if op is sre_c.LITERAL:
            if not run:
                run_start = index
            run.append(av)
            continue
        if run:
            found.append((run_start, (_run_to_bytes(run, ignorecase),)))
            run = []
        inner = _item_requirement(op, av, ignorecase)
        if inner is not None:
            found.append((index, inner))
    if run:
        found.append((run_start, (_run_to_bytes(run, ignorecase),)))
    return found


def _sequence_requirement(items, ignorecase: bool) -> tuple[bytes, ...] | None:
    return _best([alts for _, alts in _items_requirements(items, ignorecase)])


def _item_requirement(op, av, ignorecase: bool) -> tuple[bytes, ...] | None:
    if op is sre_c.SUBPATTERN:
        return _sequence_requirement(av[-1], ignorecase)
    if op is sre_c.BRANCH:
        alternatives: list[bytes] = []
        for branch in av[1]:
            best = _sequence_requirement(branch, ignorecase)
            if best is None:
                return None
            alternatives.extend(best)
        return tuple(dict.fromkeys(alternatives))
    if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and av[0] >= 1:
        return _sequence_requirement(av[2], ignorecase)
    return None


def _contains_unbounded(items) -> bool:
    for op, av in items:
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT, sre_c.POSSESSIVE_REPEAT):
            if av[1] == _MAXREPEAT or _contains_unbounded(av[2]):
                return True
        elif (op is sre_c.SUBPATTERN and _contains_unbounded(av[-1])) or (
            op is sre_c.BRANCH and any(_contains_unbounded(b) for b in av[1])
        ):
            return True
    return False


def literal_plan(pattern: str, min_length: int = 1) -> LiteralPlan | None:
    """The best required-literal set of `pattern` (longest shortest alternative), or None."""
    _, ignorecase = split_flags(pattern)
    items = list(_parse(pattern))
    found = [
        (pos, alts)
        for pos, alts in _items_requirements(items, ignorecase)
        if min(len(a) for a in alts) >= min_length
    ]
    if not found:
        return None
    position, alternatives = max(found, key=lambda f: _score(f[1]))
    # the earliest acceptable literal decides whether an unbounded repeat comes first
    earliest = min(pos for pos, _ in found)
    return LiteralPlan(
        alternatives=alternatives,
        ignorecase=ignorecase,
        position=position,
        unbounded_before=_contains_unbounded(items[:earliest]),
    )


def portability_errors(pattern: str) -> list[str]:
    """Why `pattern` is outside the portable subset (DESIGN §5); empty when it is fine."""
    try:
        parsed = _parse(pattern)
    except re.error as exc:
        return [f"does not compile: {exc}"]
    errors: list[str] = []
    if parsed.state.flags & (sre_c.SRE_FLAG_DOTALL | sre_c.SRE_FLAG_MULTILINE):
        errors.append("uses (?s) or (?m): a signature matches within one line")
    _check_items(list(parsed), errors)
    return list(dict.fromkeys(errors))


_FORBIDDEN_OPS = {
    sre_c.GROUPREF: "uses a backreference",
    sre_c.GROUPREF_EXISTS: "uses a conditional group",
    sre_c.ASSERT: "uses a lookahead/lookbehind",
    sre_c.ASSERT_NOT: "uses a negative lookahead/lookbehind",
    sre_c.ATOMIC_GROUP: "uses an atomic group",
    sre_c.POSSESSIVE_REPEAT: "uses a possessive repeat",
}
_NEWLINE_CATEGORIES = {
    sre_c.CATEGORY_SPACE: r"uses \s, which matches a newline: use [ \t]",
    sre_c.CATEGORY_NOT_DIGIT: r"uses \D, which matches a newline: use [^0-9\n]",
    sre_c.CATEGORY_NOT_WORD: r"uses \W, which matches a newline: use [^A-Za-z0-9_\n]",
}


# RE2 rejects a counted repeat above 1000, and nested counted repeats whose product is above it
RE2_MAX_REPEAT = 1000


def _check_items(items, errors: list[str], outer: int = 1) -> None:
    for op, av in items:
        if op in _FORBIDDEN_OPS:
            errors.append(_FORBIDDEN_OPS[op])
        elif op is sre_c.NOT_LITERAL and av != _NEWLINE:
            errors.append(r"has a negated character that matches a newline: add \n to it")
        elif op is sre_c.IN:
            _check_set(av, errors)
        elif op is sre_c.SUBPATTERN:
            if av[1] or av[2]:  # scoped flags (?i:...), (?-i:...)
                errors.append("uses scoped flags (?x:...): not portable")
            _check_items(av[-1], errors, outer)
        elif op is sre_c.BRANCH:
            for branch in av[1]:
                _check_items(branch, errors, outer)
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            count = av[1] if av[1] != _MAXREPEAT else av[0]
            if count * outer > RE2_MAX_REPEAT:
                errors.append(
                    f"has a counted repeat of {count}{f' inside one of {outer}' if outer > 1 else ''}:"
                    f" RE2 allows at most {RE2_MAX_REPEAT} (nested counts multiply)"
                )
            _check_items(av[2], errors, outer * max(count, 1))


def _check_set(members, errors: list[str]) -> None:
    negated = any(op is sre_c.NEGATE for op, _ in members)
    for op, av in members:
        if op is sre_c.CATEGORY and av in _NEWLINE_CATEGORIES:
            errors.append(_NEWLINE_CATEGORIES[av])
    if negated and not any(
        (op is sre_c.LITERAL and av == _NEWLINE)
        or (op is sre_c.RANGE and av[0] <= _NEWLINE <= av[1])
        for op, av in members
    ):
        errors.append(r"has a negated set [^...] that matches a newline: add \n to it")
