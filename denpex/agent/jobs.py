"""The job processes this node's agent watches, as `denpex run` or the SDK registered them.

Answers "which job does this pid or cgroup belong to?" for attribution. A process stays
known for a grace period after it exits, so that the kernel's late word on it (the OOM
victim record, the exit) is still attributed. Never blocks: /proc is read, nothing waited on.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

from denpex.core.roots import Roots
from denpex.core.wire import Registration
from denpex.host import procfs

MAX_ANCESTRY = 64
MAX_IDENTITIES = 4096
IDENTITY_TTL_S = 60.0


def parent_pid(roots: Roots, pid: int) -> int | None:
    stat = procfs.read_stat(roots, pid)
    return stat.ppid if stat else None


def cgroup_paths(roots: Roots, pid: int) -> list[str]:
    """The cgroup paths of `pid` (one per hierarchy), deduplicated, without the root."""
    paths: list[str] = []
    for entry in procfs.read_cgroups(roots, pid):
        if entry.path not in paths and entry.path != "/":
            paths.append(entry.path)
    return paths


@dataclass(slots=True)
class _Entry:
    registration: Registration
    registered_ns: int
    exited_ns: int | None = None


class JobTable:
    """Registrations by pid, thread-safe; `expire()` forgets processes gone for `grace_s`."""

    def __init__(self, roots: Roots, *, grace_s: float = 600.0) -> None:
        self.roots = roots
        self.grace_ns = int(grace_s * 1e9)
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        # descendants seen alive, so that the kernel's word on a process already reaped (the
        # OOM victim) is still attributed; refreshed by `refresh()`, pruned with the job
        self._descendants: dict[int, int] = {}
        self._identities: dict[int, tuple[float, Registration | None]] = {}
        self.changed = threading.Event()  # set by register(): look for descendants now

    def register(self, registration: Registration) -> Registration:
        """Record a job process. When the caller gave no cgroup, the process's own is used,
        unless the agent shares it: a cgroup shared with unrelated processes (a login
        session, the host's root) would attribute their evidence to the job."""
        if registration.job is None:  # every watched process belongs to some named job
            registration = Registration(
                **{**registration.to_dict(), "job": f"pid-{registration.pid}"}
            )
        if registration.cgroup is None:
            paths = cgroup_paths(self.roots, registration.pid)
            if paths and _most_specific(paths) not in cgroup_paths(self.roots, os.getpid()):
                registration = Registration(
                    **{**registration.to_dict(), "cgroup": _most_specific(paths)}
                )
        with self._lock:
            self._entries[registration.pid] = _Entry(registration, time.time_ns())
        self.changed.set()
        return registration

    def unregister(self, pid: int) -> bool:
        with self._lock:
            return self._entries.pop(pid, None) is not None

    def snapshot(self) -> list[Registration]:
        with self._lock:
            return [entry.registration for entry in self._entries.values()]

    def refresh(self) -> int:
        """Remember every live descendant of a registered process; returns how many are
        known. Costs nothing while no job is registered."""
        with self._lock:
            registered = set(self._entries)
        found: dict[int, int] = {}
        for root in registered:
            for pid in procfs.descendants(self.roots, root):
                if pid not in registered:
                    found[pid] = root
        with self._lock:
            self._descendants.update(found)
            return len(self._descendants)

    def expire(self, now_ns: int | None = None) -> list[int]:
        """Mark exited processes, forget those gone longer than the grace period."""
        now_ns = now_ns or time.time_ns()
        forgotten = []
        with self._lock:
            for pid, entry in list(self._entries.items()):
                if entry.exited_ns is None and not self.roots.proc(pid).exists():
                    entry.exited_ns = now_ns
                if entry.exited_ns is not None and now_ns - entry.exited_ns > self.grace_ns:
                    del self._entries[pid]
                    forgotten.append(pid)
            if forgotten:
                self._descendants = {
                    pid: root for pid, root in self._descendants.items() if root in self._entries
                }
        return forgotten

    def lookup(self, pid: int | None = None, cgroup: str | None = None) -> Registration | None:
        """The registration a pid (itself or an ancestor) or a cgroup path belongs to."""
        with self._lock:
            entries = dict(self._entries)
            descendants = self._descendants
        if pid is not None:
            current: int | None = pid
            for _ in range(MAX_ANCESTRY):
                if current is None or current <= 1:
                    break
                if current in entries:
                    return entries[current].registration
                if current in descendants and descendants[current] in entries:
                    return entries[descendants[current]].registration
                current = parent_pid(self.roots, current)
            if cgroup is None:
                paths = cgroup_paths(self.roots, pid)
                cgroup = _most_specific(paths) if paths else None
        if cgroup:
            for entry in entries.values():
                own = entry.registration.cgroup
                if own and own != "/" and (cgroup == own or cgroup.startswith(own + "/")):
                    return entry.registration
        return self._self_described(pid, cgroup)

    def _self_described(self, pid: int | None, cgroup: str | None) -> Registration | None:
        """An unregistered process still names its job: Slurm's environment and cgroup,
        a launcher's RANK, a Kubernetes pod's cgroup. Remembered per pid (bounded), so the
        kernel's word on it after it died is still attributed."""
        if pid is not None:
            now = time.monotonic()
            seen_at, identity = self._identities.get(pid, (0.0, None))
            # re-read a live process now and then: pids are reused
            if now - seen_at > IDENTITY_TTL_S and self.roots.proc(pid).exists():
                if len(self._identities) >= MAX_IDENTITIES:
                    self._identities.pop(next(iter(self._identities)))
                identity = procfs.process_identity(self.roots, pid)
                self._identities[pid] = (now, identity)
            if identity is not None:
                return identity
        job = procfs.identity_from_cgroup(cgroup) if cgroup else None
        return Registration(pid=pid or 0, job=job) if job else None


def _most_specific(paths: list[str]) -> str:
    """The deepest of a process's cgroup paths: on hybrid hosts it names the job's own group."""
    return max(paths, key=lambda p: (p.count("/"), len(p)))
