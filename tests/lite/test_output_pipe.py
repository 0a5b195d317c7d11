"""`denpex run` grows the pipe it writes the job's output to (as it does the job's own pipes):
a relay writing 1 MiB chunks into a pipe's default 64 KiB would wait on its reader 16 times a
chunk (benchmarks/bench_passthrough.py: about half of cat's rate without it)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.lite.spawn import PIPE_BYTES, enlarge_pipe


def _allowed() -> int:
    return min(PIPE_BYTES, int(Path("/proc/sys/fs/pipe-max-size").read_text()))


@pytest.mark.parametrize("mode", ["--no-pty", "--pty"])
def test_the_pipe_denpex_writes_to_is_grown(mode):
    r, w = os.pipe()
    try:
        assert fcntl.fcntl(r, fcntl.F_GETPIPE_SZ) < _allowed()
        done = subprocess.run(
            [sys.executable, "-m", "denpex", "run", mode, "--no-analysis", "--", "echo", "hi"],
            stdout=w,
            stdin=subprocess.DEVNULL,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0
        assert fcntl.fcntl(r, fcntl.F_GETPIPE_SZ) == _allowed()
        assert os.read(r, 100).strip() == b"hi"
    finally:
        os.close(r)
        os.close(w)


def test_a_larger_pipe_is_never_shrunk_and_other_files_are_left_alone(tmp_path, monkeypatch):
    from denpex.lite import spawn

    monkeypatch.setattr(spawn, "PIPE_BYTES", 16 << 10)  # below a new pipe's 64 KiB
    r, w = os.pipe()
    try:
        before = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
        assert before > spawn.PIPE_BYTES
        enlarge_pipe(w)
        assert fcntl.fcntl(w, fcntl.F_GETPIPE_SZ) == before
    finally:
        os.close(r)
        os.close(w)
    with open(tmp_path / "out.log", "wb") as f:
        enlarge_pipe(f.fileno())  # a regular file: nothing to grow, nothing raised
    with open(os.devnull, "wb") as f:
        enlarge_pipe(f.fileno())
    enlarge_pipe(-1)  # an invalid descriptor: nothing raised either
