"""How one catalog pattern is run on one line: Python `re` for ordinary lines, RE2 for long ones.

Both matchers confirm a (line, pattern) pair with `LineSearch.search`, and signatures take
their captures with `LineSearch.groups`. A backtracking engine can spend hundreds of
milliseconds on one crafted 64 KiB line of a pattern with bounded repeats around its literal
(`benchmarks/bench_signature_worst_case.py` finds them); RE2's automaton is linear in the line
whatever the pattern. Short lines stay on `re`, which is quicker to start. Catalog patterns are
written in the common subset of both syntaxes (the loader checks it, the tests run every
example through both), and RE2 runs in Latin-1 mode so that, like `re` on bytes, every byte is
one character and invalid UTF-8 still matches `[^\\n]`. Without google-re2 installed every line
goes to `re`: same answers, only slower on hostile lines (`engine()` says which is in use).
"""

from __future__ import annotations

import re
from typing import Any

from denpex._native.literals import compile_pattern, split_flags

# Lines longer than this go to RE2: below it `re` costs microseconds even in its worst case.
LONG_LINE = 2048

try:
    import re2 as _re2
except ImportError:  # pragma: no cover - google-re2 is a dependency; a broken install lands here
    _re2 = None


def engine() -> str:
    """'re2' when long lines are confirmed by RE2, else 're'."""
    return "re2" if _re2 is not None else "re"


class LineSearch:
    """A catalog pattern ('(?i)' prefix = ASCII case-insensitive) compiled for bytes lines."""

    __slots__ = ("_compiled", "_long", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        # compiled on first use: a scan confirms a few dozen of the catalog's patterns, and
        # compiling all of them cost a command's start ~0.2 s
        self._compiled: re.Pattern[bytes] | None = None
        self._long: Any = None  # the RE2 program, compiled on the first long line

    @property
    def compiled(self) -> re.Pattern[bytes]:
        """The `re` program (raises re.error for a pattern that does not compile)."""
        if self._compiled is None:
            self._compiled = compile_pattern(self.pattern)
        return self._compiled

    def _long_program(self) -> Any:
        if self._long is None and _re2 is not None:
            body, ignorecase = split_flags(self.pattern)
            options = _re2.Options()
            options.encoding = _re2.Options.Encoding.LATIN1
            options.case_sensitive = not ignorecase
            try:
                self._long = _re2.compile(body.encode("utf-8"), options)
            except _re2.error:  # not in RE2's syntax after all: `re` stays the engine
                self._long = False
        return self._long or None

    def search(self, line: bytes) -> bool:
        """Whether the pattern matches somewhere in `line`."""
        if len(line) > LONG_LINE and (program := self._long_program()) is not None:
            return program.search(line) is not None
        return self.compiled.search(line) is not None

    def groups(self, line: bytes) -> dict[str, bytes] | None:
        """The named groups of the first match in `line` (None for a group that did not take
        part), or None when the pattern does not match."""
        if len(line) > LONG_LINE and (program := self._long_program()) is not None:
            found = program.search(line)
            if found is None:
                return None
            return {_text(k): v for k, v in found.groupdict().items()}
        match = self.compiled.search(line)
        return None if match is None else match.groupdict()


def _text(name: str | bytes) -> str:
    return name.decode("ascii") if isinstance(name, bytes) else name
