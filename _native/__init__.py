"""denpex's native hot paths (`denpex._native.<name>`) and their pure-Python twins (`<name>_ref`).

`load(name)` returns the compiled module when it was built and `DENPEX_NO_EXTENSIONS` is not
`1`, else the reference twin. It never hides a broken build: `backend(name)` says which one
is in use, for `denpex --version --verbose` and the tests.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any

NATIVE_MODULES = (
    "linesplit",
    "linebatch",
    "matcher",
    "checksum",
    "ringbuf",
    "otlp_logs",
    "stepnumbers",
    "prefixes",
)


def extensions_disabled() -> bool:
    return os.environ.get("DENPEX_NO_EXTENSIONS") == "1"


def load(name: str) -> ModuleType:
    """The compiled `denpex._native.<name>` if available and allowed, else `<name>_ref`."""
    if not extensions_disabled():
        try:
            return importlib.import_module(f"denpex._native.{name}")
        except ImportError:
            pass
    return importlib.import_module(f"denpex._native.{name}_ref")


def backend(name: str) -> str:
    """'native' or 'reference': which implementation `load(name)` returns."""
    return "reference" if load(name).__name__.endswith("_ref") else "native"


def shared_matcher(patterns: Sequence[str]) -> Any:
    """One `matcher.Matcher` of `patterns` per process and backend, for the small fixed sets
    the scanner and the series sampler key on: a matcher never changes once built, and each
    costs ~1.5 ms to build, which a scan of many small logs paid once per log."""
    return _shared_matcher(backend("matcher"), tuple(patterns))


@functools.cache
def _shared_matcher(backend_name: str, patterns: tuple[str, ...]) -> Any:
    return load("matcher").Matcher(list(patterns))
