"""Which processes, libraries and cgroups the eBPF programs watch: job pids and their
descendants from procfs, NCCL/CUDA libraries a process maps, a cgroup folder by its inode.
Pure parsers plus bounded reads through Roots; never writes anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from denpex.core.roots import Roots, read_text
from denpex.host import procfs

CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39
COLLECTIVE_LIBRARIES = ("libnccl.so", "libcuda.so")
# hierarchies whose cgroup.procs list a registered cgroup's processes (v1 first, then v2)
_HIERARCHIES = ("memory", "pids", "cpu,cpuacct", "unified", "")


def missing_privileges(status_text: str | None, euid: int) -> str | None:
    """Why this process may not load tracing programs (None when it may): pure."""
    if euid == 0:
        return None
    for line in (status_text or "").splitlines():
        if line.startswith("CapEff:"):
            caps = int(line.split()[1], 16)
            if caps >> CAP_SYS_ADMIN & 1 or (caps >> CAP_BPF & 1 and caps >> CAP_PERFMON & 1):
                return None
            return "needs root or CAP_BPF+CAP_PERFMON (CapEff lacks them)"
    return "needs root or CAP_BPF+CAP_PERFMON (no CapEff in /proc/self/status)"


def descendants(roots: Roots, pids: Iterable[int]) -> dict[int, int]:
    """Every live process under the given pids: {pid: the registered ancestor}."""
    found: dict[int, int] = {}
    for root in pids:
        for pid in procfs.descendants(roots, root):
            found.setdefault(pid, root)
    return found


def mapped_libraries(maps_text: str, names: Iterable[str] = COLLECTIVE_LIBRARIES) -> set[str]:
    """Paths of the libraries named `names` (prefixes, e.g. libnccl.so) a process maps."""
    found = set()
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        path = parts[5].strip() if len(parts) == 6 else ""
        base = path.rsplit("/", 1)[-1]
        if path.startswith("/") and any(base.startswith(n) for n in names):
            found.add(path)
    return found


def cgroup_path_by_inode(root: Path, ino: int, limit: int = 20000) -> str | None:
    """The cgroup folder under `root` whose inode is `ino`, as /proc/<pid>/cgroup names it."""
    if not ino or not root.is_dir():
        return None
    stack, seen = [root], 0
    while stack and seen < limit:
        folder = stack.pop()
        seen += 1
        try:
            if folder.stat().st_ino == ino:
                rel = folder.relative_to(root).as_posix()
                return "/" if rel == "." else "/" + rel
            stack.extend(e for e in folder.iterdir() if e.is_dir() and not e.is_symlink())
        except OSError:
            continue
    return None


def pids_in_cgroup(roots: Roots, cgroup: str) -> list[int]:
    """The processes of a cgroup (named as /proc/<pid>/cgroup names it), from the first
    hierarchy that has it."""
    for hierarchy in _HIERARCHIES:
        text = read_text(roots.cgroup(hierarchy, cgroup, "cgroup.procs"))
        if text is not None:
            return [int(line) for line in text.split() if line.isdigit()]
    return []


def is_under(cgroup: str, parent: str) -> bool:
    """True when `cgroup` is `parent` or inside it (path components, not prefixes)."""
    parent = parent.rstrip("/")
    return cgroup == parent or cgroup.startswith(parent + "/") or parent == ""
