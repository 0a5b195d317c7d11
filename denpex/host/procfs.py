"""Parsers of /proc and cgroup files shared by the host collectors, and the job lookups on them.

Parsers are pure functions from text to values; the functions that read go through `Roots`
and return empty results for a vanished process. Nothing here raises for a missing file or
scans more of /proc than one lookup needs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from denpex.core.events import Event
from denpex.core.roots import Roots, read_text
from denpex.core.wire import Registration

# v1 limits at or above this are "no limit" (the kernel reports PAGE_COUNTER_MAX pages)
UNLIMITED_BYTES = 1 << 62


# --- pure parsers -------------------------------------------------------------------------


def parse_colon_fields(text: str) -> dict[str, str]:
    """`Key:   value` lines (status, meminfo) → {key: value stripped}."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def parse_int_fields(text: str) -> dict[str, int]:
    """`key value` lines (cpu.stat, memory.events, oom_control, numastat) → {key: int};
    lines whose value is not an integer are skipped."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                fields[parts[0]] = int(parts[1])
            except ValueError:
                continue
    return fields


def parse_kb(value: str | None) -> int | None:
    """`"123 kB"` → 125952 bytes; None when absent or malformed."""
    parts = (value or "").split()
    if len(parts) != 2 or parts[1] != "kB" or not parts[0].isdigit():
        return None  # page counts (HugePages_Total) carry no unit
    return int(parts[0]) * 1024


def parse_limit_value(text: str | None) -> int | None:
    """A cgroup limit file (`max`, or a number) → bytes/count, None for no limit."""
    if text is None:
        return None
    value = text.strip()
    if not value.isdigit():
        return None
    number = int(value)
    return None if number >= UNLIMITED_BYTES else number


@dataclass(frozen=True, slots=True)
class ProcStat:
    pid: int
    comm: str
    state: str
    ppid: int
    threads: int


def parse_stat(text: str) -> ProcStat | None:
    """/proc/<pid>/stat; the command name may contain spaces and parentheses, so split at the
    last ')'."""
    open_at, close_at = text.find("("), text.rfind(")")
    if open_at < 0 or close_at < open_at:
        return None
    rest = text[close_at + 1 :].split()
    try:
        return ProcStat(
            pid=int(text[:open_at]),
            comm=text[open_at + 1 : close_at],
            state=rest[0],
            ppid=int(rest[1]),
            threads=int(rest[17]),
        )
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True, slots=True)
class CgroupEntry:
    hierarchy: int
    controllers: tuple[str, ...]  # empty for the v2 (unified) line "0::/path"
    path: str


def parse_proc_cgroup(text: str) -> list[CgroupEntry]:
    """/proc/<pid>/cgroup lines `id:controllers:path`."""
    entries = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        controllers = tuple(c for c in parts[1].split(",") if c)
        entries.append(CgroupEntry(int(parts[0]), controllers, parts[2]))
    return entries


def cgroup_path_of(entries: Iterable[CgroupEntry], controller: str) -> str | None:
    """The path of one v1 controller, or of the v2 hierarchy when `controller` is ""."""
    for entry in entries:
        if controller in entry.controllers or (not controller and not entry.controllers):
            if not controller and entry.hierarchy != 0:
                continue  # v1 named hierarchies (name=systemd) also have no plain controller
            return entry.path
    return None


def parse_open_files_limit(text: str) -> int | None:
    """The soft "Max open files" of /proc/<pid>/limits; None when unlimited or absent."""
    for line in text.splitlines():
        if line.startswith("Max open files"):
            soft = line[len("Max open files") :].split()[0]
            return int(soft) if soft.isdigit() else None
    return None


def parse_environ(data: bytes) -> dict[str, str]:
    """/proc/<pid>/environ: NUL-separated KEY=value entries."""
    env: dict[str, str] = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


def parse_id_list(text: str) -> frozenset[int]:
    """A kernel list like `0-3,8,10-11` (cpulist, Mems_allowed_list) → ids."""
    ids: set[int] = set()
    for part in text.strip().split(","):
        low, sep, high = part.partition("-")
        if not low.strip().isdigit() or (sep and not high.strip().isdigit()):
            continue
        ids.update(range(int(low), int(high if sep else low) + 1))
    return frozenset(ids)


def format_id_list(ids: Iterable[int]) -> str:
    """The inverse of `parse_id_list`: sorted, with runs folded (`0-3,8`)."""
    runs: list[list[int]] = []
    for value in sorted(set(ids)):
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# --- reads through Roots ------------------------------------------------------------------


def read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None


def list_pids(roots: Roots) -> list[int]:
    try:
        return sorted(int(name) for name in os.listdir(roots.proc()) if name.isdigit())
    except OSError:
        return []


def read_stat(roots: Roots, pid: int) -> ProcStat | None:
    text = read_text(roots.proc(pid, "stat"))
    return parse_stat(text) if text else None


def read_status(roots: Roots, pid: int) -> dict[str, str] | None:
    text = read_text(roots.proc(pid, "status"))
    return parse_colon_fields(text) if text else None


def read_cgroups(roots: Roots, pid: int) -> list[CgroupEntry]:
    return parse_proc_cgroup(read_text(roots.proc(pid, "cgroup")) or "")


def children_of(roots: Roots, pid: int) -> list[int] | None:
    """Direct children from /proc/<pid>/task/*/children; None when the kernel has no such
    files (CONFIG_PROC_CHILDREN off), so the caller falls back to a ppid scan."""
    try:
        tids = os.listdir(roots.proc(pid, "task"))
    except OSError:
        return []  # the process is gone
    found: set[int] = set()
    seen_file = False
    for tid in tids:
        text = read_text(roots.proc(pid, "task", tid, "children"))
        if text is None:
            continue
        seen_file = True
        found.update(int(word) for word in text.split() if word.isdigit())
    return sorted(found) if seen_file or not tids else None


def descendants(roots: Roots, pid: int) -> list[int]:
    """`pid` (when it exists) and every process below it, found breadth-first."""
    if not roots.proc(pid).is_dir():
        return []
    by_parent: dict[int, list[int]] | None = None
    result, queue, seen = [], [pid], {pid}
    while queue:
        current = queue.pop(0)
        result.append(current)
        kids = children_of(roots, current)
        if kids is None:
            if by_parent is None:
                by_parent = children_by_scan(roots)
            kids = by_parent.get(current, [])
        for kid in kids:
            if kid not in seen:
                seen.add(kid)
                queue.append(kid)
    return result


def children_by_scan(roots: Roots) -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc/<pid>/stat."""
    by_parent: dict[int, list[int]] = {}
    for pid in list_pids(roots):
        stat = read_stat(roots, pid)
        if stat is not None:
            by_parent.setdefault(stat.ppid, []).append(pid)
    return by_parent


def cgroup_dirs(roots: Roots, path: str) -> list[Path]:
    """Folders of one cgroup path: the v2 folder on a unified host, the unified folder of a
    hybrid host, and each v1 controller folder that has it."""
    base = roots.cgroup()
    if (base / "cgroup.controllers").exists():
        candidates = [roots.cgroup(path)]
    else:
        try:
            hierarchies = sorted(os.listdir(base))
        except OSError:
            hierarchies = []
        candidates = [roots.cgroup(name, path) for name in hierarchies]
    return [folder for folder in candidates if (folder / "cgroup.procs").exists()]


def resolve_job_pids(
    roots: Roots,
    *,
    pid: int | None = None,
    cgroup: str | None = None,
    slurm_job_id: str | None = None,
    pod_uid: str | None = None,
) -> list[int]:
    """The processes of a job, from whichever selectors are given (their union): a root pid
    and its descendants; the members of a cgroup and its sub-cgroups (`cgroup.procs`); the
    processes whose environment has SLURM_JOB_ID=<id>; those whose cgroup path names a
    Kubernetes pod uid (the cgroupfs form with dashes or the systemd form with underscores)."""
    pids: set[int] = set()
    if pid is not None:
        pids.update(descendants(roots, pid))
    if cgroup:
        for folder in cgroup_dirs(roots, cgroup):
            for dirpath, _dirs, files in os.walk(folder):
                if "cgroup.procs" in files:
                    text = read_text(Path(dirpath, "cgroup.procs")) or ""
                    pids.update(int(w) for w in text.split() if w.isdigit())
    if slurm_job_id or pod_uid:
        wanted_env = f"SLURM_JOB_ID={slurm_job_id}".encode() if slurm_job_id else None
        uid_forms = {pod_uid, pod_uid.replace("-", "_")} if pod_uid else set()
        for candidate in list_pids(roots):
            if wanted_env is not None:
                environ = read_bytes(roots.proc(candidate, "environ")) or b""
                if wanted_env in environ.split(b"\0"):
                    pids.add(candidate)
                    continue
            if uid_forms:
                paths = [e.path for e in read_cgroups(roots, candidate)]
                if any(form in p for form in uid_forms for p in paths):
                    pids.add(candidate)
    return sorted(pids)


def job_cgroup(roots: Roots, job: Registration, controller: str) -> str | None:
    """The job's cgroup path for one v1 controller (or v2 when ""): the registered path when
    given, else the one /proc/<pid>/cgroup names."""
    if job.cgroup:
        return job.cgroup
    return cgroup_path_of(read_cgroups(roots, job.pid), controller)


# where launchers put a process's rank, most specific first
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK")
_SLURM_CGROUP = re.compile(r"/job_(\d+)(?:/step_(\w+))?")
_POD_CGROUP = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
)


def identity_from_environ(env: Mapping[str, str]) -> tuple[str | None, int | None]:
    """(job, rank) a process's environment names: the Slurm job (and step), the rank a
    launcher gave it; (None, None) for a process no scheduler started."""
    job = env.get("SLURM_JOB_ID")
    if job and env.get("SLURM_STEP_ID"):
        job = f"{job}.{env['SLURM_STEP_ID']}"
    rank = None
    for name in RANK_VARIABLES:
        if env.get(name, "").isdigit():
            rank = int(env[name])
            break
    return job, rank


def identity_from_cgroup(path: str) -> str | None:
    """The job a cgroup path names: Slurm's `/job_<id>[/step_<n>]`, a Kubernetes pod's uid."""
    found = _SLURM_CGROUP.search(path)
    if found:
        return found.group(1) + (f".{found.group(2)}" if found.group(2) else "")
    pod = _POD_CGROUP.search(path)
    return f"pod:{pod.group(1).replace('_', '-')}" if pod else None


def process_identity(roots: Roots, pid: int) -> Registration | None:
    """The job a process belongs to by its own marks (environment, cgroup path), for
    processes nobody registered; None when it carries none or is gone."""
    job, rank = identity_from_environ(parse_environ(read_bytes(roots.proc(pid, "environ")) or b""))
    if job is None:
        for entry in read_cgroups(roots, pid):
            job = identity_from_cgroup(entry.path)
            if job:
                break
    return Registration(pid=pid, job=job, rank=rank) if job else None


def attribute(event: Event, job: Registration | None) -> Event:
    """Set job, rank and tenant on an event about a registered job's process or cgroup."""
    if job is not None:
        event.job, event.rank, event.tenant = job.job, job.rank, job.tenant
    return event
