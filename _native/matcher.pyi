"""Typed surface of the compiled matcher (`denpex._native.matcher`), same as `matcher_ref`.

Stub only: it must list exactly what the compiled module exposes, nothing more.
"""

from collections.abc import Sequence

from denpex._native.contexts import MatcherPlan

class Matcher:
    patterns: list[str]
    plan: MatcherPlan | None
    def __init__(self, patterns: Sequence[str], plan: MatcherPlan | None = None) -> None: ...
    def scan(self, buf: bytes | bytearray | memoryview) -> list[tuple[int, int]]: ...
    def scan_lines(self, lines: Sequence[bytes]) -> list[tuple[int, int]]: ...
