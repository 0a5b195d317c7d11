"""Reference multi-pattern matcher: the oracle (and fallback) for the native matcher.

Semantics: `scan(buf)` returns every (line_index, pattern_index) pair for which
`re.search(pattern, line)` succeeds, lines split on b"\\n". Correct first: a literal prefilter
(one alternation of every required literal) picks candidate lines, `re` confirms them.
"""

from __future__ import annotations

import re
from bisect import bisect_right

from denpex._native.literals import compile_pattern, literal_plan


class Matcher:
    """Matches a fixed list of catalog patterns ('(?i)' prefix = ASCII case-insensitive)."""

    def __init__(self, patterns: list[str]) -> None:
        self.patterns = list(patterns)
        self._compiled = [compile_pattern(p) for p in self.patterns]
        self._literals: list[tuple[tuple[bytes, ...], bool] | None] = []
        self._always: list[int] = []  # patterns without a usable literal: confirmed on every line
        sensitive: set[bytes] = set()
        insensitive: set[bytes] = set()
        for index, pattern in enumerate(self.patterns):
            plan = literal_plan(pattern, min_length=1)
            if plan is None:
                self._literals.append(None)
                self._always.append(index)
                continue
            self._literals.append((plan.alternatives, plan.ignorecase))
            (insensitive if plan.ignorecase else sensitive).update(plan.alternatives)
        self._prefilters = [
            re.compile(
                b"|".join(re.escape(lit) for lit in sorted(lits, key=len, reverse=True)), flags
            )
            for lits, flags in ((sensitive, 0), (insensitive, re.IGNORECASE))
            if lits
        ]

    def scan(self, buf: bytes) -> list[tuple[int, int]]:
        """Every (line_index, pattern_index) match in `buf`, lines split on b'\\n'."""
        return self.scan_lines(buf.split(b"\n"))

    def scan_lines(self, lines: list[bytes]) -> list[tuple[int, int]]:
        """Every (line_index, pattern_index) match over the given lines, in line order."""
        if not lines:
            return []
        joined = b"\n".join(lines)
        starts = [0]
        for line in lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        candidates: set[int] = set()
        for prefilter in self._prefilters:
            for hit in prefilter.finditer(joined):
                candidates.add(bisect_right(starts, hit.start()) - 1)
        if self._always:
            candidates = set(range(len(lines)))
        pairs: list[tuple[int, int]] = []
        for line_index in sorted(candidates):
            line = lines[line_index]
            lowered: bytes | None = None
            for pattern_index, literals in enumerate(self._literals):
                if literals is not None:
                    alternatives, ignorecase = literals
                    if ignorecase:
                        if lowered is None:
                            lowered = line.lower()
                        haystack = lowered
                    else:
                        haystack = line
                    if not any(lit in haystack for lit in alternatives):
                        continue
                if self._compiled[pattern_index].search(line):
                    pairs.append((line_index, pattern_index))
        return pairs
