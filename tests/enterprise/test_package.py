"""The enterprise package's names load on first use: each resolves to the object its module
defines, type checkers see the same names, and a denpex command's start (its parser, which
names the bundled roles) loads none of the authentication stack."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import denpex.enterprise as enterprise


def test_every_exported_name_is_the_object_its_module_defines() -> None:
    # the imports type checkers see name each module; what loads must be that object
    tree = ast.parse(Path(enterprise.__file__).read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If))  # `if TYPE_CHECKING:`
    defined_in = {
        alias.name: node.module
        for node in guarded.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }
    assert sorted(defined_in) == sorted(enterprise.__all__)
    for name, module in defined_in.items():
        assert getattr(enterprise, name) is getattr(importlib.import_module(module), name), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        enterprise.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:
        raise AssertionError("an unknown name resolved")


def test_building_the_cli_parser_loads_no_authentication_stack() -> None:
    code = (
        "import sys; from denpex.cli.main import build_parser; build_parser(); "
        "print(sorted(m for m in sys.modules if m.startswith('denpex.enterprise')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert ast.literal_eval(out) == ["denpex.enterprise", "denpex.enterprise.policy"]
