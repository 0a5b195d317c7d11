"""Retrieval is off for the rest of the suite (tests/conftest.py); here it is what is tested."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def retrieval_on(monkeypatch):
    monkeypatch.setenv("DENPEX_RAG", "on")
