"""Shared by the eBPF tests: the built objects (built once per test module into a temporary
folder when the tools exist) and the reasons a test cannot load BPF on this machine."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROGRAMS = ("sched", "oom", "tcpretrans", "pagefault", "collective")


def build_module():
    spec = importlib.util.spec_from_file_location("denpex_bpf_build", REPO / "bpf" / "build.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def built_dir(tmp_root: Path) -> Path:
    """Objects and layouts.json built from this checkout's bpf/ (skips when it cannot)."""
    build = build_module()
    lacking = build.missing()
    if lacking:
        pytest.skip(f"cannot build the eBPF objects: missing {lacking}")
    out = tmp_root / "bpf"
    build.build(out, tmp_root / "bpf-build")
    return out


def bpf_unavailable() -> str | None:
    """Why real BPF cannot run here (None when it can)."""
    if os.geteuid() != 0:
        return "loading BPF programs needs root"
    if not Path("/sys/kernel/btf/vmlinux").exists():
        return "kernel has no BTF (/sys/kernel/btf/vmlinux)"
    try:
        from denpex.host.ebpf import loader

        loader.libbpf()
    except OSError as exc:
        return f"libbpf.so.1 not loadable: {exc}"
    return None


def have(tool: str) -> bool:
    return shutil.which(tool) is not None
