"""Fixtures shared by the host collector tests."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from denpex.core.roots import Roots

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixture_roots(tmp_path: Path) -> Callable[[str], Roots]:
    """Copy tests/host/fixtures/<name> to a temporary folder (so a test may edit it between
    polls) and return Roots pointing at its proc/, sys/ and dev/."""

    def make(name: str) -> Roots:
        tree = tmp_path / name
        shutil.copytree(FIXTURES / name, tree, symlinks=True)
        return Roots(procfs=str(tree / "proc"), sysfs=str(tree / "sys"), devfs=str(tree / "dev"))

    return make
