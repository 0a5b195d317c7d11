"""The SDK on a minimal install, for real: a clean venv (not --system-site-packages) with
`pip install torch==2.13.0` and denpex built from this tree, where neither numpy nor xxhash
exists; every dx.watch() feature runs there, with the compiled checksums and with the
pure-Python XXH3. Slow: it builds denpex and installs torch (minutes)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

# building denpex and installing torch take minutes: past pytest-timeout's default
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).parent / "children" / "minimal_sdk_job.py"
# build outputs and folders of this checkout that a source build must not see
_SKIP_NAMES = shutil.ignore_patterns(
    ".git", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.o", ".venv", "corpus"
)


def skipped(folder: str, names: list[str]) -> set[str]:
    """Build outputs, and the C that Cython generated from a .pyx beside it."""
    generated = {n for n in names if n.endswith(".c") and n[:-2] + ".pyx" in names}
    return set(_SKIP_NAMES(folder, names)) | generated


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    # never from this checkout's root, where its `denpex/` folder would shadow the install
    kwargs.setdefault("cwd", Path(cmd[0]).parents[2] if "venv" in cmd[0] else None)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{' '.join(cmd)}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def minimal_venv(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("minimal")
    venv = base / "venv"
    run([sys.executable, "-m", "venv", str(venv)], 120)
    python = venv / "bin" / "python"
    isolated = run([str(python), "-c", "import sys; print(sys.flags.no_site, sys.path)"], 30)
    assert "site-packages" not in isolated.stdout.split("[", 1)[1].split("venv")[0]
    run([str(python), "-m", "pip", "install", "--quiet", "torch==2.13.0"], 900)
    tree = base / "denpex-src"
    shutil.copytree(ROOT, tree, ignore=skipped)
    (tree / "_native" / "vendor").exists() or pytest.fail("the vendored xxHash is missing")
    run([str(python), "-m", "pip", "install", "--quiet", str(tree)], 1800)
    return python


def test_the_venv_has_torch_and_neither_numpy_nor_xxhash(minimal_venv):
    code = (
        "import importlib.util as u; print([u.find_spec(m) is None for m in ('numpy', 'xxhash')])"
    )
    assert run([str(minimal_venv), "-c", code], 60).stdout.strip() == "[True, True]"
    run([str(minimal_venv), "-c", "import torch, denpex.sdk"], 120)


@pytest.mark.parametrize("pure", [False, True], ids=["compiled", "pure-python"])
def test_every_sdk_feature_runs_on_torch_alone(minimal_venv, tmp_path, pure):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DENPEX_SDK_SOCKET")}
    env.update(PORT=str(free_port()), DENPEX_NO_EXTENSIONS="1" if pure else "0")
    done = run([str(minimal_venv), str(CHILD), str(tmp_path)], 600, env=env, cwd=tmp_path)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["backend"] == ("reference" if pure else "native")
    assert not summary["numpy"] and not summary["xxhash"]
    assert summary["errors"] == {} and summary["disabled"] == [], done.stderr
    assert "sdk_coverage_lost" not in summary["events"]
    assert "train.sdc.weights_changed_outside_optimizer" in summary["evidence"], summary
    assert summary["restored"] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert summary["corrupt_refused"]
    assert "failed" not in done.stderr, done.stderr
