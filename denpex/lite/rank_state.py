"""What one process's main thread is doing right now, from /proc: pure parsers and the reads.

`/proc/PID/syscall` names the system call the main thread is blocked in and its arguments;
a path argument is read from the process's memory (`/proc/PID/mem`, bounded to one path), a
descriptor is resolved through `/proc/PID/fd`. Readable by root or the job's own user
(ptrace rules); where the kernel refuses, the sample says so instead of guessing. Never
stops, signals or traces the process.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from denpex.core.roots import Roots, read_text

PATH_MAX = 4096
PAGE = 4096
MAX_FDS_LISTED = 32


@cache
def hang_settings() -> dict[str, Any]:
    """denpex/lite/hang.yaml: triggers, thresholds and the syscall table."""
    text = resources.files("denpex.lite").joinpath("hang.yaml").read_text()
    return yaml.safe_load(text)


@cache
def syscall_table(machine: str | None = None) -> dict[int, tuple[str, str]]:
    """number → (name, argument kind) for this machine's architecture; empty if unknown."""
    arch = machine or platform.machine()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)
    table = hang_settings()["syscalls"].get(arch) or {}
    return {int(nr): (entry[0], entry[1]) for nr, entry in table.items()}


@dataclass(frozen=True, slots=True)
class SyscallLine:
    """One `/proc/PID/syscall` line: 'running', or blocked outside a syscall (nr -1), or a
    syscall number with its six arguments."""

    running: bool
    nr: int | None = None
    args: tuple[int, ...] = ()


def parse_syscall(text: str) -> SyscallLine | None:
    words = text.split()
    if not words:
        return None
    if words[0] == "running":
        return SyscallLine(True)
    try:
        nr = int(words[0])
        args = tuple(int(w, 16) for w in words[1:7])
    except ValueError:
        return None
    return SyscallLine(False, nr, args)


def parse_state(stat_text: str) -> str | None:
    """The one-letter state of /proc/PID/stat (after the command name's last ')')."""
    close = stat_text.rfind(")")
    rest = stat_text[close + 1 :].split() if close >= 0 else []
    return rest[0] if rest else None


@dataclass(frozen=True, slots=True)
class ThreadState:
    """What a process's main thread was found doing. `kind`: "wait" (waiting for a thread,
    a socket or a set of descriptors: how ranks wait for their peers), "blocked" (a file, a
    FIFO or pipe, a sleep, a child), "disk" (uninterruptible, state D), "running"."""

    kind: str
    what: str  # "open('/data/shard_3.bin')", "read(pipe:[12])", "futex", "running"
    key: str  # equal keys on consecutive samples mean the thread has not moved on


def read_path(roots: Roots, pid: int, address: int) -> str | None:
    """The NUL-terminated string at `address` in the process, or None when not readable."""
    try:
        fd = os.open(roots.proc(pid, "mem"), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = b""
        at = address
        while len(data) < PATH_MAX:
            size = PAGE - at % PAGE  # never across an unmapped page boundary in one read
            try:
                piece = os.pread(fd, size, at)
            except OSError:
                break
            if not piece:
                break
            data += piece
            if b"\0" in piece:
                break
            at += len(piece)
    finally:
        os.close(fd)
    if not data:
        return None
    return data.split(b"\0", 1)[0][:PATH_MAX].decode("utf-8", "replace")


def fd_target(roots: Roots, pid: int, fd: int) -> str | None:
    try:
        return os.readlink(roots.proc(pid, "fd", fd))
    except OSError:
        return None


def open_files(roots: Roots, pid: int) -> list[str]:
    """`N=target` of the process's descriptors (at most MAX_FDS_LISTED), files first."""
    try:
        names = sorted(int(n) for n in os.listdir(roots.proc(pid, "fd")) if n.isdigit())
    except OSError:
        return []
    found = []
    for fd in names:
        target = fd_target(roots, pid, fd)
        if target is not None:
            found.append((target.startswith(("socket:", "anon_inode:", "pipe:")), fd, target))
    return [f"{fd}={target}" for _, fd, target in sorted(found)[:MAX_FDS_LISTED]]


def classify(
    roots: Roots,
    pid: int,
    state: str | None,
    call: SyscallLine | None,
    table: dict[int, tuple[str, str]],
) -> ThreadState:
    """The main thread's state from its process state letter and syscall line."""
    if state == "D":
        prefix = "disk"
    elif state == "R" or (call is not None and call.running):
        return ThreadState("running", "running on a CPU", "running")
    else:
        prefix = ""
    if call is None or call.nr is None or call.nr < 0:
        kind = prefix or "blocked"
        return ThreadState(kind, "a page fault or the kernel", f"{kind}:-1")
    name, arg = table.get(call.nr, (f"syscall {call.nr}", "other"))
    kind = prefix or ("wait" if arg == "wait" else "blocked")
    what = name
    if arg.startswith("path "):
        index = int(arg.split()[1])
        path = read_path(roots, pid, call.args[index]) if index < len(call.args) else None
        what = f"{name}({path!r})" if path is not None else f"{name}(a path denpex may not read)"
    elif arg.startswith("fd "):
        index = int(arg.split()[1])
        fd = call.args[index] if index < len(call.args) else -1
        target = fd_target(roots, pid, fd) if fd >= 0 else None
        what = f"{name}({target or f'fd {fd}'})"
        if target is not None and target.startswith("socket:") and not prefix:
            kind = "wait"  # reading or writing a socket: talking to a peer
    return ThreadState(kind, what, f"{kind}:{what}")


def sample_thread(roots: Roots, pid: int, table: dict[int, tuple[str, str]]) -> ThreadState | None:
    """The main thread's state now; None when the process is gone."""
    stat = read_text(roots.proc(pid, "stat"))
    if stat is None:
        return None
    call = parse_syscall(read_text(roots.proc(pid, "syscall")) or "")
    return classify(roots, pid, parse_state(stat), call, table)


def wchan(roots: Roots, pid: int) -> str:
    """The kernel function the process sleeps in ('' or '0' when running or hidden)."""
    text = (read_text(roots.proc(pid, "wchan")) or "").strip()
    return "" if text == "0" else text
