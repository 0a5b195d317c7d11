"""Fixtures of the GPU tests: the fake libnvidia-ml.so.1 and the fake libdcgm (as DCGM 3 and
as DCGM 4), each built once per test session."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from denpex.gpu.nvml.scenario import build_fake_library

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def fake_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake_library(tmp_path_factory.mktemp("nvml-fake"))


@pytest.fixture(scope="session")
def fake_dcgms(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The fake libdcgm as DCGM 3 (libdcgm.so.3) and as DCGM 4 (libdcgm.so.4)."""
    if not shutil.which("gcc"):
        pytest.skip("needs gcc to build the fake libdcgm")
    folder = tmp_path_factory.mktemp("fake_dcgm")
    source = REPO / "tests" / "fakes" / "dcgm" / "fake_dcgm.c"
    built = {}
    for major in (3, 4):
        out = folder / f"libdcgm.so.{major}"
        command = ["gcc", "-shared", "-fPIC", "-O1", f"-DFAKE_DCGM_MAJOR={major}", "-o", str(out)]
        subprocess.run([*command, str(source)], check=True)
        built[major] = out
    return built
