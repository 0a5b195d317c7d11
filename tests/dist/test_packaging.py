"""The wheel carries every package of the source tree: pyproject.toml lists packages by
hand (some live outside denpex/, mapped by package-dir), and an editable install hides a
package left off that list — only a user's `pip install .` would find it missing."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _listed_dirs() -> set[Path]:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = tool.get("package-dir", {})
    out = set()
    for package in tool["packages"]:
        base = next(
            (
                p
                for p in sorted(mapped, key=len, reverse=True)
                if package == p or package.startswith(p + ".")
            ),
            None,
        )
        if base is None:
            out.add(ROOT / Path(*package.split(".")))
        else:
            rest = package[len(base) :].lstrip(".")
            out.add(ROOT / mapped[base] / Path(*rest.split(".")) if rest else ROOT / mapped[base])
    return out


def test_every_package_of_the_tree_is_in_the_wheel():
    listed = _listed_dirs()
    tree = {
        p.parent for top in ("denpex", "sdk", "_native") for p in (ROOT / top).rglob("__init__.py")
    }
    missing = sorted(str(p.relative_to(ROOT)) for p in tree - listed)
    assert not missing, (
        f"packages missing from pyproject.toml [tool.setuptools] packages: {missing}"
    )
    absent = sorted(str(p.relative_to(ROOT)) for p in listed if not (p / "__init__.py").is_file())
    assert not absent, f"packages listed in pyproject.toml but not in the tree: {absent}"
