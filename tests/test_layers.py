"""The layer import contract of DESIGN §2, checked on the source with `ast`.

A module may import only packages on lower lines; packages on one line never import each
other; inside a package, modules never import each other in a circle. Lazy imports inside
functions count too: they are still dependencies.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [
    ["denpex._native"],
    ["denpex.core"],
    ["denpex.catalog", "denpex.series"],
    ["denpex.diagnosis"],
    ["denpex.retrieval"],
    [
        "denpex.host",
        "denpex.gpu",
        "denpex.fabric",
        "denpex.sdk",
        "denpex.enterprise",
    ],
    ["denpex.lite"],
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


def test_collectors_never_import_the_wrapper():
    assert LEVEL["denpex.lite"] > max(LEVEL[p] for p in ("denpex.host", "denpex.gpu"))


# --- no import cycles inside a package ------------------------------------------------------


def module_name(pkg: str, path: Path) -> str:
    folder = SOURCE_DIRS.get(pkg, ROOT / Path(*pkg.split(".")))
    parts = [pkg, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(files: list[tuple[str, Path]]) -> dict[str, set[str]]:
    """module → the modules of its own package it imports (`from pkg import name` counts as
    an import of `pkg.name` when that is a module, else of `pkg` itself)."""
    names = {module_name(pkg, path): pkg for pkg, path in files}
    graph: dict[str, set[str]] = {name: set() for name in names}
    for pkg, path in files:
        own = module_name(pkg, path)
        for _, imported in imported_modules(path, own):
            while imported and imported not in names:
                imported = imported.rpartition(".")[0]
            if imported and imported != own and names[imported] == pkg:
                graph[own].add(imported)
        for node in ast.walk(ast.parse(path.read_text()) if path.suffix == ".py" else ast.Module()):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}"
                    if target in names and target != own and names[target] == pkg:
                        graph[own].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_inside_a_package():
    graph = import_graph(source_files())
    assert graph["denpex.cli.run"], "the graph must see imports inside a package"
    assert cycles(graph) == []


def test_cycle_check_catches_a_circle(tmp_path):
    pkg = tmp_path / "denpex" / "cli"
    pkg.mkdir(parents=True)
    (pkg / "main.py").write_text("def build():\n    from denpex.cli import run\n")
    (pkg / "run.py").write_text("from denpex.cli.main import build\n")
    (pkg / "scan.py").write_text("from denpex.cli.main import build\n")
    files = [("denpex.cli", path) for path in sorted(pkg.glob("*.py"))]
    SOURCE_DIRS["denpex.cli"] = pkg
    try:
        graph = import_graph(files)
    finally:
        del SOURCE_DIRS["denpex.cli"]
    assert cycles(graph) == [["denpex.cli.main", "denpex.cli.run"]]
