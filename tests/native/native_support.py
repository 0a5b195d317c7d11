"""Shared by the native-module tests: import a compiled module or skip with the reason.

It never falls back to the reference: a test that asks for the native module tests it or skips.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

import denpex._native as native


def native_module(name: str) -> ModuleType:
    """The compiled `denpex._native.<name>`, or skip the test saying why it is absent."""
    if native.extensions_disabled():
        pytest.skip("DENPEX_NO_EXTENSIONS=1: the pure-Python reference is in use")
    try:
        return importlib.import_module(f"denpex._native.{name}")
    except ImportError as exc:
        pytest.skip(f"denpex._native.{name} is not built ({exc}); `pip install -e .` builds it")
