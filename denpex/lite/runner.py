"""The transparent wrapper: runs a command so that every byte it writes reaches us unchanged.

Puts the pieces together: spawn (pipes or a PTY, below the job's supervisor), terminal (raw
mode, stdin), job_signals (forwarding, job control), relay (output to us and to the
analysis ring). The relay must
never wait on analysis (the ring drops analysis input, never output), never alter or
reorder a stream's bytes, and the terminal and signals it changed are always restored.
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Mapping

from denpex.lite.analysis_channel import Analyzer
from denpex.lite.analysis_ring import SPILL_BYTES
from denpex.lite.child_env import child_environ
from denpex.lite.job_signals import JobSignals
from denpex.lite.job_supervisor import LINGER_S
from denpex.lite.relay import AnalysisSession, Relay, RunResult, SessionFactory, relay_child
from denpex.lite.spawn import (
    Child,
    enlarge_pipe,
    fd_valid,
    hold_std_fds,
    spawn_failed,
    spawn_pipes,
    spawn_pty,
)
from denpex.lite.terminal import RawStdin

__all__ = ["AnalysisSession", "RunResult", "SessionFactory", "run_command", "tee_stream"]


def run_command(
    argv: list[str],
    *,
    use_pty: bool | None = None,
    session_factory: SessionFactory | None = None,
    ring_bytes: int = 8 << 20,
    spill_bytes: int = SPILL_BYTES,
    extra_env: Mapping[str, str] | None = None,
    linger: float = LINGER_S,
) -> int:
    """Run argv transparently (PTY iff our stdout is a TTY, unless forced); the exit status.

    extra_env: variables added to the child's environment (the SDK socket's address).
    spill_bytes: how much output may wait on disk for a lagging analyzer (0: none, a full
    ring drops).
    linger: after the child exits, how long its output may stay silent while descendants
    still hold it open, before they are ended (relay_child)."""
    if not argv:
        raise ValueError("run_command needs a command to run")
    if use_pty is None:
        use_pty = os.isatty(1)
    env = child_environ(extra=extra_env)
    stdin_ok = fd_valid(0)
    placeholders = hold_std_fds()  # a closed 0/1/2 must not be reused by our own pipes
    for fd in (1, 2):
        enlarge_pipe(fd)
    analyzer = Analyzer.start(session_factory, ring_bytes, spill_bytes) if session_factory else None
    raw = RawStdin(use_pty)
    finished = False
    child: Child | None = None
    try:
        with JobSignals(use_pty, raw) as sig:
            relay = Relay(analyzer, stop=lambda: sig.stop_requested)
            started = time.monotonic()
            try:
                child = (spawn_pty if use_pty else spawn_pipes)(argv, env, raw, stdin_ok)
            except OSError as exc:
                if analyzer is not None:
                    analyzer.abort()
                    finished = True
                return spawn_failed(argv[0], exc)
            if analyzer is not None:
                analyzer.begin(child.pid)
            sig.start(child.pid, child.master)
            try:
                if use_pty:
                    raw.enter()
                wstatus = relay_child(child, relay, sig, linger)
            finally:
                raw.restore()
            child.supervisor.end()  # the leftovers end while the report is written
            code = os.waitstatus_to_exitcode(wstatus)
            result = RunResult(
                exit_code=code if code >= 0 else None,
                exit_signal=-code if code < 0 else None,
                status=code if code >= 0 else 128 - code,
                bytes_total=relay.total,
                bytes_dropped=0,
                chunks_dropped=0,
                duration_s=time.monotonic() - started,
                child_pid=child.pid,
            )
            status = relay.conclude(result).status
            finished = True
            return status
    finally:
        if child is not None:
            child.supervisor.close()  # without end() (a failure above) it kills the job
        if analyzer is not None:
            if not finished:
                analyzer.abort()
            analyzer.ring.close()
        for fd in placeholders:
            os.close(fd)


def tee_stream(
    in_fd: int,
    out_fd: int | None,
    *,
    session_factory: SessionFactory | None,
    ring_bytes: int = 8 << 20,
) -> RunResult:
    """Copy in_fd to out_fd byte-exactly until EOF while analysing it. out_fd None: analyse
    only, and drop nothing (reading waits for the analyzer instead). If out_fd's reader goes
    away, copying stops but analysis goes on to EOF."""
    analyzer = Analyzer.start(session_factory, ring_bytes) if session_factory else None
    relay = Relay(analyzer, lossless=out_fd is None)
    dest = -1 if out_fd is None else out_fd
    if out_fd is not None:
        enlarge_pipe(out_fd)
    finished = False
    try:
        if analyzer is not None:
            analyzer.begin(None)
        started = time.monotonic()
        while n := relay.pump(in_fd, dest, 1):
            if n < 0:  # a non-blocking descriptor: wait for it
                select.select([in_fd], [], [])
        result = RunResult(None, None, 0, relay.total, 0, 0, time.monotonic() - started, None)
        relay.conclude(result)
        finished = True
        return result
    finally:
        if analyzer is not None:
            if not finished:
                analyzer.abort()
            analyzer.ring.close()
