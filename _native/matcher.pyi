"""Typed surface of the compiled matcher (`denpex._native.matcher`), same as `matcher_ref`.

Stub only: it must list exactly what the compiled module exposes, nothing more.
"""

from collections.abc import Sequence

class Matcher:
    patterns: list[str]
    def __init__(self, patterns: Sequence[str]) -> None: ...
    def scan(self, buf: bytes | bytearray | memoryview) -> list[tuple[int, int]]: ...
    def scan_lines(self, lines: Sequence[bytes]) -> list[tuple[int, int]]: ...
