"""The layer import contract of DESIGN §2, checked on the source with `ast`.

A module may import only packages on lower lines; packages on one line never import each
other. Lazy imports inside functions count too: they are still dependencies.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    ["denpex._native"],
    ["denpex.core"],
    ["denpex.catalog"],
    ["denpex.diagnosis"],
    [
        "denpex.lite",
        "denpex.host",
        "denpex.gpu",
        "denpex.fabric",
        "denpex.sdk",
        "denpex.enterprise",
    ],
    ["denpex.agent"],
    ["denpex.remediation"],
    ["denpex.control"],
    ["denpex.cli"],
]
LEVEL = {pkg: level for level, line in enumerate(LAYERS) for pkg in line}
SOURCE_DIRS = {"denpex._native": ROOT / "_native", "denpex.sdk": ROOT / "sdk"}


def package_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "denpex" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def source_files() -> list[tuple[str, Path]]:
    files = []
    for pkg in LEVEL:
        folder = SOURCE_DIRS.get(pkg, ROOT / Path(*pkg.split(".")))
        for path in sorted(folder.rglob("*.py")) + sorted(folder.rglob("*.pyx")):
            files.append((pkg, path))
    return files


def imported_modules(path: Path, own_module: str) -> list[tuple[int, str]]:
    if path.suffix == ".pyx":
        lines = [
            line for line in path.read_text().splitlines() if line.startswith(("import ", "from "))
        ]
        text = "\n".join(
            line for line in lines if " cimport " not in line and not line.startswith("cimport")
        )
    else:
        text = path.read_text()
    tree = ast.parse(text)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = own_module.rsplit(".", node.level)[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            if module == "denpex":  # `from denpex import core`
                found.extend((node.lineno, f"denpex.{alias.name}") for alias in node.names)
    return found


def test_every_layer_is_known():
    top = {
        p.name for p in (ROOT / "denpex").iterdir() if p.is_dir() and not p.name.startswith("__")
    }
    assert {f"denpex.{name}" for name in top} <= set(LEVEL), (
        "add new packages to DESIGN §2 and LAYERS"
    )


@pytest.mark.parametrize("pkg,path", source_files(), ids=lambda v: str(v)[-50:])
def test_imports_respect_layers(pkg, path):
    module = pkg + "." + path.stem
    violations = []
    for lineno, imported in imported_modules(path, module):
        target = package_of(imported)
        if target is None or target == pkg or target not in LEVEL:
            continue
        if LEVEL[target] >= LEVEL[pkg]:
            violations.append(f"{path.relative_to(ROOT)}:{lineno}: {pkg} imports {imported}")
    assert not violations, "\n".join(violations)


def test_contract_catches_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from denpex.lite.scanner import Scanner\n")
    assert [m for _, m in imported_modules(bad, "denpex.core.bad")] == ["denpex.lite.scanner"]
    assert LEVEL[package_of("denpex.lite.scanner")] > LEVEL["denpex.core"]
