"""Reference multi-pattern matcher: the oracle (and fallback) for the native matcher.

Semantics: `scan(buf)` returns every (line_index, pattern_index) pair for which
`re.search(pattern, line)` succeeds, lines split on b"\\n". Correct first: a literal prefilter
(one `bytes.find` pass per required literal) picks candidate lines, `re` confirms them.
"""

from __future__ import annotations

from bisect import bisect_right

from denpex._native.contexts import MatcherPlan
from denpex._native.linesearch import LineSearch
from denpex._native.literals import literal_plan


class Matcher:
    """Matches a fixed list of catalog patterns ('(?i)' prefix = ASCII case-insensitive)."""

    def __init__(self, patterns: list[str], plan: MatcherPlan | None = None) -> None:
        # the native matcher's plan is of no use here (its literal table takes no time to
        # build): taken for the same signature, never kept
        self.patterns = list(patterns)
        self.plan: MatcherPlan | None = None
        self._compiled = [LineSearch(p) for p in self.patterns]
        self._always: list[int] = []  # patterns without a usable literal: confirmed on every line
        # (literal, ignorecase) → the patterns that require it (one of their alternatives)
        self._by_literal: dict[tuple[bytes, bool], list[int]] = {}
        for index, pattern in enumerate(self.patterns):
            plan = literal_plan(pattern, min_length=1)
            if plan is None:
                self._always.append(index)
                continue
            for literal in plan.alternatives:
                self._by_literal.setdefault((literal, plan.ignorecase), []).append(index)

    def scan(self, buf: bytes) -> list[tuple[int, int]]:
        """Every (line_index, pattern_index) match in `buf`, lines split on b'\\n'."""
        return self.scan_lines(buf.split(b"\n"))

    def scan_lines(self, lines: list[bytes]) -> list[tuple[int, int]]:
        """Every (line_index, pattern_index) match over the given lines, in line order."""
        if not lines:
            return []
        candidates = self._candidates(lines)
        pairs: list[tuple[int, int]] = []
        for line_index in sorted(candidates):
            line = lines[line_index]
            search = self._compiled
            pairs.extend(
                (line_index, pattern_index)
                for pattern_index in sorted(candidates[line_index])
                if search[pattern_index].search(line)
            )
        return pairs

    def _candidates(self, lines: list[bytes]) -> dict[int, set[int]]:
        """line index → the patterns one of whose required literals occurs on that line.

        One memmem pass (bytes.find) per distinct literal over the joined lines: far faster
        than a regex alternation of hundreds of literals, which `re` tries one by one."""
        candidates: dict[int, set[int]] = {}
        if self._always:
            for line_index in range(len(lines)):
                candidates[line_index] = set(self._always)
        joined = b"\n".join(lines)
        lowered = joined.lower() if any(ic for _, ic in self._by_literal) else b""
        starts = [0]
        for line in lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        end = len(joined)
        for (literal, ignorecase), pattern_indexes in self._by_literal.items():
            haystack = lowered if ignorecase else joined
            position = haystack.find(literal)
            while position != -1:
                line_index = bisect_right(starts, position) - 1
                candidates.setdefault(line_index, set()).update(pattern_indexes)
                next_line = starts[line_index + 1] if line_index + 1 < len(starts) else end
                position = haystack.find(literal, next_line)
        return candidates
