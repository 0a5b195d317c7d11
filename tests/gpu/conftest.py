"""Fixtures of the GPU tests: the fake libnvidia-ml.so.1, built once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from denpex.gpu.nvml.scenario import build_fake_library


@pytest.fixture(scope="session")
def fake_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_library(tmp_path_factory.mktemp("nvml-fake"))
