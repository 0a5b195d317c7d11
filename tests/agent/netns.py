"""Another host for tests, on this one: a network namespace joined to the host by a veth
pair (host side 10.213.<n>.1/30, namespace side .2), created by the test and deleted in a
finally, and a way to run a stdlib-only Python snippet in it or as another user.

Needs root and `ip`; `unavailable_reason()` names what is missing, for a skip that says so.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from tests import netns_dir

NOBODY = 65534


def unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces and other users need root"
    if shutil.which("ip") is None:
        return "the ip command is missing (Debian: iproute2)"
    return None


def setpriv_reason() -> str | None:
    if os.geteuid() != 0:
        return "running as another user needs root"
    if shutil.which("setpriv") is None:
        return "setpriv is missing (Debian: util-linux)"
    return None


@dataclass(frozen=True, slots=True)
class Namespace:
    name: str
    host_address: str  # the agent's address as seen from inside
    address: str  # the namespace's own address


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def other_host() -> Iterator[Namespace]:
    tag = f"{os.getpid() % 10000}{random.randrange(100):02d}"
    subnet = random.randrange(1, 250)
    name, host_if, ns_if = f"dxt{tag}", f"dxh{tag}", f"dxn{tag}"
    created: list[str] = []
    before = netns_dir.snapshot()
    try:
        _ip("netns", "add", name)
        created.append("netns")
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        created.append("link")
        _ip("link", "set", ns_if, "netns", name)
        _ip("addr", "add", f"10.213.{subnet}.1/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", name, "addr", "add", f"10.213.{subnet}.2/30", "dev", ns_if)
        _ip("-n", name, "link", "set", ns_if, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield Namespace(name, f"10.213.{subnet}.1", f"10.213.{subnet}.2")
    finally:
        if "link" in created:
            subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
        if "netns" in created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
        netns_dir.restore(before)


def python_for_others() -> str:
    """An interpreter another user can run: this one, else a python3 on PATH (this one may
    sit in a folder only its owner can read)."""
    probe = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    on_path = [os.path.join(d, "python3") for d in os.environ.get("PATH", "").split(os.pathsep)]
    for candidate in [sys.executable, *(p for p in on_path if os.access(p, os.X_OK))]:
        ok = subprocess.run([*probe, candidate, "-c", "pass"], capture_output=True, timeout=30)
        if ok.returncode == 0:
            return candidate
    raise RuntimeError("no Python interpreter that uid 65534 may run")


def run_python(code: str, *args: str, netns: str | None = None, user: int | None = None):
    """Run a stdlib-only snippet (in a namespace, as another user); its stdout and status."""
    command: list[str] = []
    if netns is not None:
        command += ["ip", "netns", "exec", netns]
    if user is not None:
        command += ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
    python = python_for_others() if user is not None else sys.executable
    return subprocess.run(
        [*command, python, "-I", "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
