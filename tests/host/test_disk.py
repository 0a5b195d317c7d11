"""The disk collector: the fill decision on numbers, and a real small tmpfs filled up."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from denpex.core.collector import CollectContext
from denpex.core.events import Event, Evidence
from denpex.core.roots import Roots
from denpex.host.disk import DiskCollector, Usage, detector_for, fill_level


def evidence(out: list) -> list[Evidence]:
    return [e for e in out if isinstance(e, Evidence)]


def test_fill_level_and_category() -> None:
    assert fill_level(0.5, 0.10, 0.02) == "ok"
    assert fill_level(0.05, 0.10, 0.02) == "warning"
    assert fill_level(0.01, 0.10, 0.02) == "error"
    assert detector_for("/dev/shm") == "host.shm_exhausted.low_free_space"
    assert detector_for("/dev/shm/") == "host.shm_exhausted.low_free_space"
    assert detector_for("/ckpt") == "host.disk_full.low_free_space"


def test_inodes_running_out_counts_as_full() -> None:
    assert Usage(avail_bytes=90, size_bytes=100, inodes_free=1, inodes=100).avail_ratio == 0.01
    assert Usage(avail_bytes=90, size_bytes=100, inodes_free=0, inodes=0).avail_ratio == 0.9
    assert Usage(avail_bytes=0, size_bytes=0, inodes_free=0, inodes=0).avail_ratio == 1.0


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_fill_level_is_monotonic(a: float, b: float, warn: float) -> None:
    err = warn / 2
    levels = ("ok", "warning", "error")
    low, high = sorted((a, b))
    assert levels.index(fill_level(low, warn, err)) >= levels.index(fill_level(high, warn, err))


def test_missing_path_reported_once(tmp_path: Path) -> None:
    roots = Roots(devfs=str(tmp_path / "dev"))  # no shm in it
    collector = DiskCollector(roots, {"checkpoint_dirs": [str(tmp_path / "nope")]})
    ctx = CollectContext(roots=roots, host="n")
    first = collector.collect(ctx)
    assert sorted(e.attrs["path"] for e in first if isinstance(e, Event)) == [
        "/dev/shm",
        str(tmp_path / "nope"),
    ]
    assert all(e.kind == "state" and not isinstance(e, Evidence) for e in first)
    assert collector.collect(ctx) == []


def test_metrics_of_a_real_path(tmp_path: Path) -> None:
    collector = DiskCollector(Roots(), {"paths": [], "checkpoint_dirs": [str(tmp_path)]})
    out = collector.collect(CollectContext(roots=Roots(), host="n", now_ns=2))
    got = {e.body: e.attrs["value"] for e in out if isinstance(e, Event) and e.kind == "metric"}
    assert set(got) == set(collector.metrics_help)
    assert 0 < got["disk_avail_bytes"] <= got["disk_size_bytes"]
    assert all(e.attrs["path"] == str(tmp_path) and e.host == "n" for e in out)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_filling_a_real_tmpfs(tmp_path: Path) -> None:
    if shutil.which("mount") is None:
        pytest.skip("no mount(8) on this host")
    dev = tmp_path / "dev"
    shm = dev / "shm"
    shm.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(shm)], check=True)
    try:
        roots = Roots(devfs=str(dev))
        collector = DiskCollector(roots)
        ctx = CollectContext(roots=roots, host="n")
        assert evidence(collector.collect(ctx)) == []
        (shm / "a").write_bytes(b"\0" * (3800 * 1024))  # ~93% full: warning
        warn = evidence(collector.collect(ctx))
        assert [(e.signature, e.category, e.severity) for e in warn] == [
            ("host.shm_exhausted.low_free_space", "host.shm_exhausted", "warning")
        ]
        assert warn[0].captures["path"] == "/dev/shm"
        assert int(warn[0].captures["avail_bytes"]) < 400 * 1024
        assert evidence(collector.collect(ctx)) == []  # same level: said once
        with open(shm / "b", "wb") as f:  # fill it to the last byte
            try:
                f.write(b"\0" * (1024 * 1024))
            except OSError:
                pass
        err = evidence(collector.collect(ctx))
        assert [(e.severity, e.action) for e in err] == [("error", "fix_config")]
        (shm / "a").unlink()
        (shm / "b").unlink()
        assert evidence(collector.collect(ctx)) == []  # recovered: re-armed, nothing to say
    finally:
        subprocess.run(["umount", str(shm)], check=True)
