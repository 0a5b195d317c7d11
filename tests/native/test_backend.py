"""A built extension must be what `denpex._native.load` returns (never a silent fallback)."""

from __future__ import annotations

from pathlib import Path

import pytest

import denpex._native as native

PACKAGE_DIR = Path(native.__file__).parent


def built_files(name: str) -> list[Path]:
    return [p for pattern in (f"{name}.*.so", f"{name}.*.pyd") for p in PACKAGE_DIR.glob(pattern)]


@pytest.mark.parametrize("name", native.NATIVE_MODULES)
def test_built_extension_is_the_one_loaded(name):
    if native.extensions_disabled():
        assert native.backend(name) == "reference"
        pytest.skip("DENPEX_NO_EXTENSIONS=1: the reference is expected")
    files = built_files(name)
    if not files:
        pytest.skip(f"no compiled {name} in {PACKAGE_DIR.name}/: extensions were not built")
    module = native.load(name)
    assert native.backend(name) == "native", (
        f"{files[0].name} exists but load({name!r}) returned {module.__name__}: the extension "
        "does not import (rebuild with `pip install -e . --no-build-isolation`)"
    )


@pytest.mark.parametrize("name", native.NATIVE_MODULES)
def test_every_native_module_has_its_reference_and_stub(name):
    assert (PACKAGE_DIR / f"{name}_ref.py").is_file()
    assert (PACKAGE_DIR / f"{name}.pyi").is_file()
    assert (PACKAGE_DIR / f"{name}.pyx").is_file()


def test_disabled_extensions_load_the_reference(monkeypatch):
    monkeypatch.setenv("DENPEX_NO_EXTENSIONS", "1")
    for name in native.NATIVE_MODULES:
        assert native.load(name).__name__ == f"denpex._native.{name}_ref"


def test_the_both_backends_fixture_switches_what_load_returns(both_backends):
    from denpex.catalog import load_catalog

    for name in native.NATIVE_MODULES:
        assert native.backend(name) == both_backends
    assert load_catalog().backend == both_backends
