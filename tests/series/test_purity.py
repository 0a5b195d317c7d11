"""denpex.series is pure: no torch, no numpy, anywhere in it (checked on the source and by
importing every module in an interpreter where both are blocked)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import denpex.series

FOLDER = Path(denpex.series.__file__).parent
FORBIDDEN = ("torch", "numpy", "jax")


def test_no_module_imports_torch_or_numpy():
    found = []
    for path in sorted(FOLDER.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN]
    assert found == []


def test_every_module_imports_with_torch_and_numpy_blocked():
    modules = [f"denpex.series.{p.stem}" for p in sorted(FOLDER.glob("*.py"))]
    code = (
        "import sys, importlib\n"
        + "".join(f"sys.modules[{name!r}] = None\n" for name in FORBIDDEN)
        + f"for m in {modules!r}: importlib.import_module(m)\n"
        + "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
