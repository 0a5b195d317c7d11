"""The job processes this node's agent watches, as `denpex run` or the SDK registered them.

Answers "which job does this pid or cgroup belong to?" for attribution. A process stays
known for a grace period after it exits, so that the kernel's late word on it (the OOM
victim record, the exit) is still attributed. Each registration remembers who made it (the
uid the agent's socket saw): only that user (or root) may remove it, each user holds a
bounded number, and one costs O(1) to add or to look up however many there are (a cgroup
index, descendants looked up at most once per refresh interval in one pass). Never blocks:
/proc is read, nothing waited on.
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
SCAN_ABOVE = 64  # registered roots beyond which descendants come from one pass over /proc
OWN_CGROUPS_TTL_S = 60.0


class RegistrationRefused(Exception):
    """A registration or removal this caller may not make; `status` is the HTTP answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


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
    owner: int | None = None  # the registrant's uid (None: the agent itself, or a test)


def process_uid(roots: Roots, pid: int) -> int | None:
    """The real uid of a live process, from /proc/<pid>/status; None when it is gone."""
    status = procfs.read_status(roots, pid)
    uid = (status or {}).get("Uid", "").split()
    return int(uid[0]) if uid and uid[0].isdigit() else None


class JobTable:
    """Registrations by pid, thread-safe; `expire()` forgets processes gone for `grace_s`."""

    def __init__(
        self, roots: Roots, *, grace_s: float = 600.0, max_per_user: int | None = None
    ) -> None:
        self.roots = roots
        self.grace_ns = int(grace_s * 1e9)
        self.max_per_user = max_per_user  # None: unbounded; root is never bounded
        self._lock = threading.Lock()
        self._entries: dict[int, _Entry] = {}
        self._by_cgroup: dict[str, int] = {}  # a registration's cgroup → its pid
        self._per_owner: dict[int, int] = {}
        # descendants seen alive, so that the kernel's word on a process already reaped (the
        # OOM victim) is still attributed; refreshed by `refresh()`, pruned with the job
        self._descendants: dict[int, int] = {}
        self._identities: dict[int, tuple[float, Registration | None]] = {}
        self._own_cgroups: tuple[float, list[str]] = (-OWN_CGROUPS_TTL_S, [])
        self.changed = threading.Event()  # set by register(): look for descendants soon

    def register(self, registration: Registration, *, owner: int | None = None) -> Registration:
        """Record a job process for `owner` (a uid; None: trusted). When the caller gave no
        cgroup, the process's own is used, unless the agent shares it: a cgroup shared with
        unrelated processes (a login session, the host's root) would attribute their
        evidence to the job. A user other than root may name only the process's own cgroup."""
        if registration.job is None:  # every watched process belongs to some named job
            registration = Registration(
                **{**registration.to_dict(), "job": f"pid-{registration.pid}"}
            )
        paths = cgroup_paths(self.roots, registration.pid)
        if registration.cgroup is None:
            if paths and _most_specific(paths) not in self._agent_cgroups():
                registration = Registration(
                    **{**registration.to_dict(), "cgroup": _most_specific(paths)}
                )
        elif owner not in (None, 0) and registration.cgroup not in paths:
            raise RegistrationRefused(
                403, f"cgroup {registration.cgroup} is not one of process {registration.pid}'s"
            )
        with self._lock:
            previous = self._entries.get(registration.pid)
            if previous is not None and owner not in (None, 0, previous.owner):
                raise RegistrationRefused(403, f"pid {registration.pid} is another user's job")
            if (
                previous is None
                and owner not in (None, 0)
                and self.max_per_user is not None
                and self._per_owner.get(owner, 0) >= self.max_per_user
            ):
                raise RegistrationRefused(
                    429,
                    f"uid {owner} already has {self.max_per_user} registrations "
                    "(api.max_registrations_per_user)",
                )
            if previous is not None:
                self._forget_locked(registration.pid)
            self._entries[registration.pid] = _Entry(registration, time.time_ns(), owner=owner)
            if owner is not None:
                self._per_owner[owner] = self._per_owner.get(owner, 0) + 1
            if registration.cgroup and registration.cgroup != "/":
                self._by_cgroup[registration.cgroup] = registration.pid
        self.changed.set()
        return registration

    def _agent_cgroups(self) -> list[str]:
        """The agent's own cgroup paths, read once a minute rather than per registration."""
        read_at, paths = self._own_cgroups
        if time.monotonic() - read_at > OWN_CGROUPS_TTL_S:
            paths = cgroup_paths(self.roots, os.getpid())
            self._own_cgroups = (time.monotonic(), paths)
        return paths

    def unregister(self, pid: int, *, owner: int | None = None) -> bool:
        """Remove a registration; a user other than root may remove only their own."""
        with self._lock:
            entry = self._entries.get(pid)
            if entry is None:
                return False
            if owner not in (None, 0) and entry.owner != owner:
                raise RegistrationRefused(403, f"pid {pid} was registered by another user")
            self._forget_locked(pid)
            return True

    def _forget_locked(self, pid: int) -> None:
        entry = self._entries.pop(pid)
        if entry.owner is not None:
            left = self._per_owner.get(entry.owner, 1) - 1
            if left:
                self._per_owner[entry.owner] = left
            else:
                self._per_owner.pop(entry.owner, None)
        cgroup = entry.registration.cgroup
        if cgroup and self._by_cgroup.get(cgroup) == pid:
            del self._by_cgroup[cgroup]

    def owner(self, pid: int) -> int | None:
        with self._lock:
            entry = self._entries.get(pid)
            return entry.owner if entry else None

    def owned_by(self, uid: int) -> list[Registration]:
        with self._lock:
            return [e.registration for e in self._entries.values() if e.owner == uid]

    def count(self) -> int:
        with self._lock:
            return len(self._entries)

    def snapshot(self) -> list[Registration]:
        with self._lock:
            return [entry.registration for entry in self._entries.values()]

    def refresh(self) -> int:
        """Remember every live descendant of a registered process; returns how many are
        known. Costs nothing while no job is registered; with many registered processes,
        one pass over /proc instead of one walk per process."""
        with self._lock:
            registered = set(self._entries)
        found: dict[int, int] = {}
        if len(registered) > SCAN_ABOVE:
            by_parent = procfs.children_by_scan(self.roots)
            for root in registered:
                queue = list(by_parent.get(root, []))
                while queue:
                    pid = queue.pop()
                    if pid not in registered and pid not in found:
                        found[pid] = root
                        queue.extend(by_parent.get(pid, []))
        else:
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
                    self._forget_locked(pid)
                    forgotten.append(pid)
            if forgotten:
                self._descendants = {
                    pid: root for pid, root in self._descendants.items() if root in self._entries
                }
        return forgotten

    def lookup(self, pid: int | None = None, cgroup: str | None = None) -> Registration | None:
        """The registration a pid (itself or an ancestor) or a cgroup path belongs to."""
        if pid is not None:
            current: int | None = pid
            for _ in range(MAX_ANCESTRY):
                if current is None or current <= 1:
                    break
                with self._lock:
                    entry = self._entries.get(current)
                    if entry is None and current in self._descendants:
                        entry = self._entries.get(self._descendants[current])
                if entry is not None:
                    return entry.registration
                current = parent_pid(self.roots, current)
            if cgroup is None:
                paths = cgroup_paths(self.roots, pid)
                cgroup = _most_specific(paths) if paths else None
        if cgroup:
            path = cgroup
            while path and path != "/":  # the cgroup itself, then each parent: O(depth)
                with self._lock:
                    owner_pid = self._by_cgroup.get(path)
                    entry = self._entries.get(owner_pid) if owner_pid is not None else None
                if entry is not None:
                    return entry.registration
                path = path.rsplit("/", 1)[0]
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
