"""The job's descendants under `denpex run`: output they still write after the job's exit is
relayed, every orphan is adopted and reaped by the supervisor, and nothing of the job outlives
the run or a SIGKILLed denpex — with and without analysis, with pipes and a PTY. Real
processes throughout (tests/lite/children)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.lite.test_transparency import (
    CHILD,
    ENV,
    launch,
    process_gone,
    run,
    run_pty,
    wait_for_file,
)

LATE = "(sleep 1.2; echo LATE) & exit {code}"


def ppid_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def zombie_children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == pid:
                found.append(int(entry))
    return found


def with_linger(args: list[str], seconds: str) -> list[str]:
    split = args.index("--")
    return [*args[:split], "--linger", seconds, *args[split:]]


# ---------------------------------------------------------------------------- late output
@pytest.mark.parametrize("code", [0, 3])
def test_output_of_a_grandchild_after_the_job_exits_is_relayed(code: int) -> None:
    proc = run(launch("pipe", ["sh", "-c", LATE.format(code=code)]))
    assert (proc.returncode, proc.stdout, proc.stderr) == (code, b"LATE\n", b"")


@pytest.mark.parametrize("analysis", [True, False])
def test_denpex_run_piped_to_cat_prints_the_late_line(analysis: bool) -> None:
    options = "-q" if analysis else "--no-analysis"
    pipeline = (
        f"{sys.executable} -m denpex run --no-pty {options} -- sh -c '{LATE.format(code=5)}'"
        " | cat; echo status=${PIPESTATUS[0]}"
    )
    proc = subprocess.run(["bash", "-c", pipeline], capture_output=True, timeout=120, env=ENV)
    assert proc.stdout == b"LATE\nstatus=5\n", proc.stderr


def test_a_pty_grandchild_that_survives_the_hangup_is_relayed() -> None:
    # the session leader's exit hangs up the terminal's foreground group; one that ignores
    # SIGHUP writes on, and its output ends only when it closes the terminal (EIO)
    cmd = ["sh", "-c", "trap '' HUP; (sleep 1.2; echo LATE) & exit 4"]
    res = run_pty(launch("pty", cmd))
    assert (res.rc, res.output) == (4, b"LATE\r\n")


def test_linger_inf_waits_for_the_last_writer() -> None:
    cmd = ["sh", "-c", "(sleep 2.5; echo LATE) & exit 0"]
    proc = run(with_linger(launch("pipe", cmd), "inf"))
    assert (proc.returncode, proc.stdout) == (0, b"LATE\n")


def test_a_silent_holder_is_ended_after_the_linger_time(tmp_path: Path) -> None:
    pidfile = tmp_path / "holder.pid"
    cmd = ["sh", "-c", f"sleep 30 & echo $! > {pidfile}; echo a; exit 2"]
    start = time.monotonic()
    proc = run(with_linger(launch("pipe", cmd), "0.3"))
    assert (proc.returncode, proc.stdout) == (2, b"a\n")
    assert time.monotonic() - start < 20  # not the holder's 30 s
    assert process_gone(int(pidfile.read_text()), timeout=0.1)


# ---------------------------------------------------------------------------- leftovers
@pytest.mark.parametrize("mode", ["pipe", "pty"])
def test_nothing_of_the_job_outlives_a_normal_run(tmp_path: Path, mode: str) -> None:
    quiet, stubborn = tmp_path / "quiet.pid", tmp_path / "stubborn.pid"
    script = (
        f"sleep 30 >/dev/null 2>&1 & echo $! > {quiet}; "
        f"(trap '' TERM HUP; exec sleep 31) >/dev/null 2>&1 & echo $! > {stubborn}; exit 0"
    )
    if mode == "pipe":
        assert run(launch("pipe", ["sh", "-c", script])).returncode == 0
    else:
        assert run_pty(launch("pty", ["sh", "-c", script])).rc == 0
    assert process_gone(int(quiet.read_text()), timeout=0.1)
    assert process_gone(int(stubborn.read_text()), timeout=0.1)  # SIGKILL after SIGTERM


def test_orphans_are_adopted_and_reaped_by_the_supervisor(tmp_path: Path) -> None:
    pidfile, daemon = tmp_path / "child.pid", tmp_path / "daemon.pid"
    args = launch("pipe", [*CHILD, "daemon", str(pidfile), str(daemon)])
    proc = subprocess.Popen(args, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        child_pid, daemon_pid = int(wait_for_file(pidfile)), int(wait_for_file(daemon))
        supervisor = ppid_of(child_pid)
        assert ppid_of(supervisor) == proc.pid  # denpex → supervisor → job
        assert ppid_of(daemon_pid) == supervisor  # the subreaper adopted the orphan
        deadline = time.monotonic() + 5
        while zombie_children(supervisor) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert zombie_children(supervisor) == []  # the daemon's exited parent was reaped
        os.kill(child_pid, signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert process_gone(daemon_pid, timeout=0.1)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("mode", ["pipe", "pty"])
@pytest.mark.parametrize("session", ["none", "count"])
@pytest.mark.parametrize("kind", ["group", "daemon"])
def test_sigkill_of_denpex_takes_every_descendant_within_a_second(
    tmp_path: Path, mode: str, session: str, kind: str
) -> None:
    pidfile, grandfile = tmp_path / "child.pid", tmp_path / "grandchild.pid"
    command = "pidfile" if kind == "group" else "daemon"
    args = launch(mode, [*CHILD, command, str(pidfile), str(grandfile)], session=session,
                  out=tmp_path / "a.json")  # fmt: skip
    proc = subprocess.Popen(
        args, env=ENV, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        child_pid, grand_pid = int(wait_for_file(pidfile)), int(wait_for_file(grandfile))
        supervisor = ppid_of(child_pid)
        proc.kill()
        proc.wait(timeout=10)
        assert process_gone(child_pid, timeout=1.0), "the child outlived a SIGKILLed denpex"
        assert process_gone(grand_pid, timeout=1.0), f"the {kind} grandchild survived"
        assert process_gone(supervisor, timeout=5.0), "the supervisor stayed behind"
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_supervisor_takes_the_job_and_denpex_says_so(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    proc = subprocess.Popen(launch("pipe", [*CHILD, "pidfile", str(pidfile)]), env=ENV,
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        child_pid = int(wait_for_file(pidfile))
        os.kill(ppid_of(child_pid), signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + signal.SIGKILL
        assert err == b"denpex: the job's supervisor was killed; the job with it\n"
        assert process_gone(child_pid, timeout=1.0)
    finally:
        proc.kill()
        proc.wait()


# ---------------------------------------------------------------------------- signals
@pytest.mark.parametrize("ignored", [[], [signal.SIGHUP, signal.SIGINT]])
def test_the_job_gets_the_signal_dispositions_denpex_was_given(ignored: list[int]) -> None:
    def ignore() -> None:
        for sig in ignored:
            signal.signal(sig, signal.SIG_IGN)

    direct = subprocess.run([*CHILD, "signals"], capture_output=True, preexec_fn=ignore, env=ENV)
    wrapped = subprocess.run(launch("pipe", [*CHILD, "signals"]), capture_output=True,
                             stdin=subprocess.DEVNULL, preexec_fn=ignore, env=ENV)  # fmt: skip
    assert wrapped.returncode == 0
    assert json.loads(wrapped.stdout) == json.loads(direct.stdout)
