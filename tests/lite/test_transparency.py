"""The wrapper is transparent: real child processes, real pipes and PTYs, byte-exact checks.

Every test runs denpex's runner in its own process (tests/lite/children/launch.py) around a
real command; nothing is mocked. Random payloads use fixed seeds (printed on failure).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import termios
import time
import tty
from dataclasses import dataclass
from pathlib import Path

import pytest

from denpex.lite.child_env import child_environ

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LAUNCH = [sys.executable, str(HERE / "children" / "launch.py")]
CHILD = [sys.executable, str(HERE / "children" / "child.py")]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
sys.path.insert(0, str(HERE / "children"))
from child import payload  # noqa: E402

PIPE_SIGNALS = list(range(1, 16))
PTY_SIGNALS = [1, 2, 9, 15]
EXIT_CODES = [0, 1, 2, 3, 64, 127, 254, 255]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def launch(mode: str, cmd: list[str], *, session: str = "none", out: Path | None = None,
           ring: int | None = None, delay: float = 0.0,
           spill: int | None = None) -> list[str]:  # fmt: skip
    args = [*LAUNCH, mode, "--session", session]
    if spill is not None:
        args += ["--spill", str(spill)]
    if out is not None:
        args += ["--out", str(out)]
    if ring is not None:
        args += ["--ring", str(ring)]
    if delay:
        args += ["--delay", str(delay)]
    return [*args, "--", *cmd]


def run(args: list[str], **kw: object) -> subprocess.CompletedProcess[bytes]:
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run(args, capture_output=True, timeout=60, env=ENV, **kw)  # type: ignore[call-overload]


@dataclass
class PtyRun:
    rc: int
    output: bytes
    stderr: bytes


def run_pty(args: list[str], *, stdin_data: bytes | None = None, on_output=None,
            size: tuple[int, int] = (33, 111), timeout: float = 30.0) -> PtyRun:  # fmt: skip
    """Run args with a fresh terminal as stdout (and stdin unless stdin_data is given)."""
    master, slave = os.openpty()
    termios.tcsetwinsize(slave, size)
    if stdin_data is not None:
        tty.setraw(slave)  # nobody else sets it raw: keep the test terminal byte-exact
    ctty = 0 if stdin_data is None else 1
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            args,
            stdin=slave if stdin_data is None else subprocess.PIPE,
            stdout=slave,
            stderr=err,
            env=ENV,
            start_new_session=True,
            preexec_fn=lambda: fcntl.ioctl(ctty, termios.TIOCSCTTY, 0),
        )
        os.close(slave)
        if stdin_data is not None:
            proc.stdin.write(stdin_data)  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        out = bytearray()
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if not select.select([master], [], [], 0.05)[0]:
                    continue
                try:
                    data = os.read(master, 1 << 16)
                except OSError as exc:
                    assert exc.errno == errno.EIO
                    break
                if not data:
                    break
                out += data
                if on_output is not None:
                    on_output(bytes(out), master, proc)
            else:
                proc.kill()
                pytest.fail(f"timed out; output so far: {bytes(out[-300:])!r}")
            rc = proc.wait(timeout=10)
        finally:
            os.close(master)
        err.seek(0)
        return PtyRun(rc, bytes(out), err.read())


def wait_for_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.01)
    return path.read_text()


def process_gone(pid: int, timeout: float = 5.0) -> bool:
    """True once pid has exited (a zombie awaiting its reaper counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


# ---------------------------------------------------------------------------- exit status
@pytest.mark.parametrize("code", EXIT_CODES)
def test_exit_code_pipe(code: int) -> None:
    assert run(launch("pipe", ["sh", "-c", f"exit {code}"])).returncode == code


@pytest.mark.parametrize("code", EXIT_CODES)
def test_exit_code_pty(code: int) -> None:
    assert run_pty(launch("pty", ["sh", "-c", f"exit {code}"])).rc == code


@pytest.mark.parametrize("sig", PIPE_SIGNALS)
def test_killed_by_signal_pipe(sig: int) -> None:
    proc = run(launch("pipe", [*CHILD, "die", str(sig)]))
    assert proc.returncode == 128 + sig, proc.stderr


@pytest.mark.parametrize("sig", PTY_SIGNALS)
def test_killed_by_signal_pty(sig: int) -> None:
    assert run_pty(launch("pty", [*CHILD, "die", str(sig)])).rc == 128 + sig


@pytest.mark.parametrize("mode", ["pipe", "pty"])
def test_command_not_found(mode: str) -> None:
    proc = run(launch(mode, ["denpex-no-such-command-xyz"]))
    assert proc.returncode == 127
    assert proc.stderr == (
        b"denpex: cannot run 'denpex-no-such-command-xyz': No such file or directory\n"
    )


def test_command_not_executable(tmp_path: Path) -> None:
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\necho hi\n")
    proc = run(launch("pipe", [str(script)]))
    assert proc.returncode == 126
    assert b"Permission denied" in proc.stderr and proc.stderr.count(b"\n") == 1


# ---------------------------------------------------------------------------- bytes
def test_64mib_random_pipe_byte_identical(tmp_path: Path) -> None:
    seed, n_out, n_err = 1234, 64 << 20, 8 << 20
    print("seed", seed)
    report = tmp_path / "analysis.json"
    proc = run(launch("pipe", [*CHILD, "random", str(n_out), str(n_err), str(seed)],
                      session="count", out=report))  # fmt: skip
    assert proc.returncode == 0
    assert len(proc.stdout) == n_out and sha(proc.stdout) == sha(payload(seed, n_out))
    err = proc.stderr
    assert len(err) == n_err and sha(err) == sha(payload(seed + 1, n_err))
    doc = json.loads(report.read_text())
    res = doc["result"]
    assert res["bytes_total"] == n_out + n_err
    seen = doc["bytes"]["1"] + doc["bytes"]["2"]
    assert seen + res["bytes_dropped"] == n_out + n_err
    if res["bytes_dropped"] == 0:
        assert doc["sha"]["1"] == sha(proc.stdout) and doc["sha"]["2"] == sha(err)


@pytest.mark.parametrize("mode", ["pipe", "pty"])
def test_write_256k_and_exit_loses_nothing(mode: str) -> None:
    seed, n = 77, 256 << 10
    print("seed", seed)
    if mode == "pipe":
        out = run(launch("pipe", [*CHILD, "random", str(n), "0", str(seed)])).stdout
    else:
        out = run_pty(launch("pty", [*CHILD, "raw-random", str(n), str(seed)])).output
    assert len(out) == n and out == payload(seed, n)


def test_pty_line_discipline_crlf_passes_through() -> None:
    text = "".join(f"line {i}\n" for i in range(5000))
    res = run_pty(launch("pty", ["python3", "-c", f"print({text!r}, end='')"]))
    assert res.rc == 0
    assert res.output == text.replace("\n", "\r\n").encode()


def test_stdout_and_stderr_stay_separate() -> None:
    proc = run(launch("pipe", ["sh", "-c", "echo out1; echo err1 >&2; echo out2; exit 5"]))
    assert (proc.returncode, proc.stdout, proc.stderr) == (5, b"out1\nout2\n", b"err1\n")


def test_auto_mode_follows_stdout() -> None:
    proc = run(launch("auto", [*CHILD, "tty"]))
    assert proc.returncode == 1 and b"Inappropriate ioctl" in proc.stderr  # pipes: no tty
    res = run_pty(launch("auto", [*CHILD, "tty"]))
    doc = json.loads(res.output.decode().strip())
    assert res.rc == 0 and doc["tty"].startswith("/dev/pts/") and doc["size"] == [111, 33]


def test_window_size_follows_sigwinch() -> None:
    def resize(out: bytes, master: int, proc: subprocess.Popen) -> None:
        if out.endswith(b"ready\r\n"):
            termios.tcsetwinsize(master, (40, 132))

    res = run_pty(launch("pty", [*CHILD, "winch"]), on_output=resize)
    assert res.rc == 0 and b'{"size": [132, 40]}' in res.output


def test_grandchild_holding_output_does_not_hang() -> None:
    # the grandchild keeps the output open, silent, far longer than --linger: the run ends
    # without it (a run that waited for it would print "late")
    proc = run(launch("pipe", ["sh", "-c", "echo a; (sleep 30; echo late) & exit 0"]))
    assert (proc.returncode, proc.stdout) == (0, b"a\n")


def test_reader_going_away_gives_the_child_sigpipe() -> None:
    proc = subprocess.Popen(launch("pipe", ["yes"]), stdout=subprocess.PIPE, env=ENV)
    assert proc.stdout is not None
    assert proc.stdout.read(4096).startswith(b"y\ny\n")
    proc.stdout.close()
    assert proc.wait(timeout=10) == 128 + signal.SIGPIPE


# ---------------------------------------------------------------------------- signals
@pytest.mark.parametrize("mode", ["pipe", "pty"])
def test_sigterm_reaches_the_child(mode: str) -> None:
    def term(out: bytes, master: int, proc: subprocess.Popen) -> None:
        if out.endswith(b"ready\r\n"):
            proc.send_signal(signal.SIGTERM)

    if mode == "pty":
        res = run_pty(launch("pty", [*CHILD, "trap-term"]), on_output=term)
        assert res.rc == 7 and res.output == b"ready\r\ngot-term\r\n"
        return
    proc = subprocess.Popen(launch("pipe", [*CHILD, "trap-term"]), stdout=subprocess.PIPE, env=ENV)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.stdout.read() == b"got-term\n"
    assert proc.wait(timeout=10) == 7


@pytest.mark.parametrize("session", ["none", "count"])
def test_sigkill_to_denpex_leaves_no_child(tmp_path: Path, session: str) -> None:
    pidfile, grandfile = tmp_path / "child.pid", tmp_path / "grandchild.pid"
    cmd = [*CHILD, "pidfile", str(pidfile)]
    if session != "none":  # the analyzer also takes the child's process group down
        cmd.append(str(grandfile))
    proc = subprocess.Popen(launch("pipe", cmd, session=session, out=tmp_path / "a.json"),
                            env=ENV, stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        child_pid = int(wait_for_file(pidfile))
        proc.kill()
        proc.wait(timeout=10)
        assert process_gone(child_pid), "the child outlived a SIGKILLed denpex"
        if session != "none":
            assert process_gone(int(grandfile.read_text())), "the grandchild survived"
    finally:
        proc.kill()


# ---------------------------------------------------------------------------- stdin
def test_stdin_forwarded_with_eof_pipe() -> None:
    data = payload(5, 3 << 20)
    proc = run(launch("pipe", ["cat"]), input=data, stdin=None)
    assert proc.returncode == 0 and sha(proc.stdout) == sha(data)


def test_closed_stdin_gives_the_child_dev_null() -> None:
    cmd = ["sh", "-c", 'exec "$@" 0<&-', "sh", *launch("pipe", ["cat"])]
    proc = run(cmd)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, b"", b"")


def test_stdin_eof_in_pty_mode_is_veof() -> None:
    res = run_pty(launch("pty", ["cat"]), stdin_data=b"hello\nworld")
    assert res.rc == 0
    assert res.output.count(b"hello\r\n") == 2 and res.output.count(b"world") == 2


def test_interactive_typing_in_pty_mode() -> None:
    typed: list[bytes] = []

    def typist(out: bytes, master: int, proc: subprocess.Popen) -> None:
        # `go` shows denpex made our terminal raw and relays; then type a line, then Ctrl-D
        keys = b"hello\n" if not typed else b"\x04" if out.count(b"hello\r\n") == 2 else b""
        if keys and len(typed) < 2:
            typed.append(keys)
            os.write(master, keys)

    res = run_pty(launch("pty", ["sh", "-c", "echo go; exec cat"]), on_output=typist)
    assert res.rc == 0 and typed == [b"hello\n", b"\x04"]
    assert res.output == b"go\r\nhello\r\nhello\r\n"


# ---------------------------------------------------------------------------- environment
def test_child_environment_is_ours() -> None:
    proc = run(launch("pipe", [*CHILD, "env"]))
    assert json.loads(proc.stdout) == ENV


def test_frozen_environment_restores_ld_library_path() -> None:
    base = {"A": "1", "LD_LIBRARY_PATH": "/frozen/_MEI", "LD_LIBRARY_PATH_ORIG": "/usr/x"}
    assert child_environ(base, frozen=True) == {"A": "1", "LD_LIBRARY_PATH": "/usr/x"}
    del base["LD_LIBRARY_PATH_ORIG"]
    assert child_environ(base, frozen=True) == {"A": "1"}
    assert child_environ(base, frozen=False) == base


# ---------------------------------------------------------------------------- analysis
def test_analysis_sees_every_byte(tmp_path: Path) -> None:
    seed, n = 9, 2 << 20  # fits the 8 MiB ring: nothing can be dropped
    report = tmp_path / "a.json"
    proc = run(launch("pipe", [*CHILD, "random", str(n), str(n // 2), str(seed)],
                      session="count", out=report))  # fmt: skip
    doc = json.loads(report.read_text())
    assert proc.returncode == 0 and doc["result"]["bytes_dropped"] == 0
    assert doc["sha"] == {"1": sha(payload(seed, n)), "2": sha(payload(seed + 1, n // 2))}
    assert doc["child_pid"] == doc["result"]["child_pid"] and doc["gaps"] == 0


def test_slow_analysis_never_slows_or_alters_output(tmp_path: Path) -> None:
    report, timing = tmp_path / "a.json", tmp_path / "t"
    n = 32 << 20
    proc = run(launch("pipe", [*CHILD, "timed-writer", str(n), str(timing)], session="count",
                      out=report, ring=256 << 10, delay=0.05, spill=0))  # fmt: skip
    assert proc.returncode == 0
    assert proc.stdout == b"0123456789abcdef" * (n // 16) + b"tail\n"
    assert float(timing.read_text()) < 3.0  # 32 MiB at 64 KiB per 50 ms would take 25 s
    doc = json.loads(report.read_text())
    res = doc["result"]
    assert res["bytes_dropped"] > 0 and res["chunks_dropped"] > 0 and doc["gaps"] > 0
    assert doc["bytes"]["1"] + res["bytes_dropped"] == n + 5 == res["bytes_total"]


@pytest.mark.parametrize("mode", ["pipe", "pty"])
def test_a_lagging_analysis_reads_every_byte_from_the_spill(tmp_path: Path, mode: str) -> None:
    """The ring holds 256 KiB, the analyzer takes 20 ms a chunk: the relay does not wait for
    it, the backlog waits on disk, and analysis reads all of it, in order, without a gap."""
    report, timing = tmp_path / "a.json", tmp_path / "t"
    n = 32 << 20
    proc = run(launch(mode, [*CHILD, "timed-writer", str(n), str(timing)], session="count",
                      out=report, ring=256 << 10, delay=0.02))  # fmt: skip
    assert proc.returncode == 0
    if mode == "pipe":
        assert proc.stdout == b"0123456789abcdef" * (n // 16) + b"tail\n"
    doc = json.loads(report.read_text())
    res = doc["result"]
    assert res["bytes_dropped"] == 0 and res["chunks_dropped"] == 0 and doc["gaps"] == 0
    # the relay spills instead of waiting: bytes in the spill are bytes it did not wait for
    assert 0 < res["bytes_spilled"] < res["bytes_total"] == doc["bytes"]["1"]
    if mode == "pipe":
        assert doc["last"].endswith("tail\n") and doc["sha"]["1"] == sha(proc.stdout)


@pytest.mark.parametrize("mode", ["pipe", "pty"])
def test_analysis_gets_the_last_words_even_when_behind(tmp_path: Path, mode: str) -> None:
    report, n = tmp_path / "a.json", 16 << 20
    proc = run(launch(mode, [*CHILD, "burst", str(n)], session="count", out=report,
                      ring=256 << 10, delay=0.02, spill=0))  # fmt: skip
    assert proc.returncode == 3
    if mode == "pipe":
        assert proc.stdout == b"0123456789abcdef" * (n // 16) + b"FINAL-MARKER\n"
    doc = json.loads(report.read_text())
    assert doc["result"]["bytes_dropped"] > 0 and doc["gaps"] > 0
    assert doc["last"].endswith("FINAL-MARKER\n" if mode == "pipe" else "FINAL-MARKER\r\n")


def test_analysis_ticks_while_the_child_runs(tmp_path: Path) -> None:
    report = tmp_path / "a.json"
    proc = run(launch("pty", ["sleep", "0.7"], session="count", out=report))
    assert proc.returncode == 0
    assert json.loads(report.read_text())["ticks"] >= 2


@pytest.mark.parametrize("session", ["fail", "broken"])
def test_failing_analysis_keeps_output_and_status(session: str) -> None:
    proc = run(launch("pipe", ["sh", "-c", "echo out; echo err >&2; exit 3"], session=session))
    assert (proc.returncode, proc.stdout) == (3, b"out\n")
    lines = sorted(proc.stderr.decode().splitlines())
    assert len(lines) == 2 and lines[1] == "err"
    assert lines[0].startswith("denpex: analysis failed: RuntimeError: ")


def test_dead_analyzer_changes_nothing() -> None:
    data = payload(13, 4 << 20)
    proc = run(launch("pipe", ["sh", "-c", "cat; exit 6"], session="crash", ring=64 << 10),
               input=data, stdin=None)  # fmt: skip
    assert proc.returncode == 6 and sha(proc.stdout) == sha(data)
    assert proc.stderr == b"denpex: analysis stopped unexpectedly (signal 9); no report\n"
    proc = run(launch("scan", [], session="crash", ring=64 << 10), input=data, stdin=None)
    assert (proc.returncode, proc.stdout) == (0, b"")  # a lossless scan does not wait forever


def test_tee_copies_byte_exactly(tmp_path: Path) -> None:
    data, report = payload(11, 4 << 20), tmp_path / "a.json"
    proc = run(launch("tee", [], session="count", out=report), input=data, stdin=None)
    assert proc.returncode == 0 and sha(proc.stdout) == sha(data)
    doc = json.loads(report.read_text())
    assert doc["result"]["bytes_total"] == len(data) and doc["result"]["child_pid"] is None
    assert doc["sha"]["1"] == sha(data)


def test_scan_without_output_drops_nothing(tmp_path: Path) -> None:
    data, report = payload(12, 2 << 20), tmp_path / "a.json"
    proc = run(launch("scan", [], session="count", out=report, ring=64 << 10, delay=0.001),
               input=data, stdin=None)  # fmt: skip
    assert (proc.returncode, proc.stdout) == (0, b"")
    doc = json.loads(report.read_text())
    assert doc["result"]["bytes_dropped"] == 0 and doc["sha"]["1"] == sha(data)
