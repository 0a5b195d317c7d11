"""Shared by the bundle tests: build a bundle with dist_scripts/build_bundle.sh, unpack it,
run its install.sh, and snapshot an install prefix to prove what was (not) written."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD_BUNDLE = ROOT / "dist_scripts" / "build_bundle.sh"

PLACEHOLDER = """#!/bin/sh
# placeholder for the frozen binary (fast tests only)
case "$1" in
  --version) echo "denpex {version}" ;;
  run) shift; [ "$1" = "--" ] && shift; "$@"; exit $? ;;
  *) echo "placeholder: $*" ;;
esac
"""


def build_bundle(
    out: Path,
    key_dir: Path,
    *,
    version: str,
    binary_dir: Path | None = None,
    static: Path | None = None,
    key_file: Path | None = None,
) -> Path:
    """Run build_bundle.sh; returns the tarball."""
    cmd = ["bash", str(BUILD_BUNDLE), "--version", version, "--out", str(out)]
    cmd += ["--key", str(key_file)] if key_file else ["--throwaway-key", str(key_dir)]
    if binary_dir is not None:
        cmd += ["--binary-dir", str(binary_dir)]
    if static is not None:
        cmd += ["--static", str(static), "--python", sys.executable]
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / f"denpex-airgap-bundle-{version}-{os.uname().machine}.tar.gz"


def placeholder_payload(folder: Path, version: str) -> tuple[Path, Path]:
    onedir = folder / "onedir"
    (onedir / "_internal").mkdir(parents=True)
    exe = onedir / "denpex"
    exe.write_text(PLACEHOLDER.format(version=version))
    exe.chmod(0o755)
    (onedir / "_internal" / "libbpf.so.1").write_bytes(b"\x7fELF placeholder")
    static = folder / "denpex-static"
    shutil.copy(exe, static)
    return onedir, static


def unpack(tarball: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="tar")
    (folder,) = dest.iterdir()
    return folder


def repack(folder: Path, tarball: Path) -> Path:
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return tarball


def install(
    bundle: Path,
    *args: str,
    netns: bool = False,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    cmd = ["bash", str(bundle / "install.sh"), *args]
    if netns:
        cmd = ["unshare", "-n", *cmd]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def snapshot(prefix: Path) -> dict[str, tuple]:
    """Every path under prefix with its kind, content hash or link target, and mtime."""
    if not prefix.exists():
        return {}
    found: dict[str, tuple] = {}
    for path in sorted([prefix, *prefix.rglob("*")]):
        st = path.lstat()
        rel = str(path.relative_to(prefix))
        if path.is_symlink():
            found[rel] = ("link", os.readlink(path), st.st_mtime_ns)
        elif path.is_file():
            found[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest(), st.st_mtime_ns)
        else:
            found[rel] = ("dir", st.st_mtime_ns)
    return found


def flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    index = len(data) // 2 if offset is None else offset
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


def unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0
