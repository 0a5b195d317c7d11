"""Host evidence `denpex run` gathers for its own child without any agent (DESIGN §4).

The kernel log records that appear during the run (`/dev/kmsg`, when readable) and the
memory events of the child's cgroup (v1 `memory.oom_control`/`memory.failcnt`, v2
`memory.events`). Every path goes through configurable roots so tests use fixture trees.
Never blocks: kmsg is read non-blocking, cgroup files are read twice (start and end).
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass
from pathlib import Path

from denpex.core.events import Event, Evidence
from denpex.core.kmsg import parse_prefix, wall_ns_from_usec
from denpex.lite.prefixes import ParsedLine, parse_line

KMSG_RECORD_MAX = 8192

CGROUP_OOM_SIGNATURE = "host.oom_killed.cgroup_oom_kill"
CGROUP_OOM_EXPLAIN = (
    "The kernel's OOM killer killed a process in the job's memory cgroup because the cgroup "
    "reached its memory limit. Lower host memory use (fewer DataLoader workers, smaller "
    "prefetch, no full-dataset copies in RAM) or raise the job's memory request."
)


class KmsgWatch:
    """Reads `/dev/kmsg` records written after start, non-blocking, counting overruns."""

    def __init__(self, devfs: str = "/dev") -> None:
        self.path = os.path.join(devfs, "kmsg")
        self.fd: int | None = None
        self.lost_records = 0
        self.unavailable: str | None = None

    def open(self) -> bool:
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            os.lseek(self.fd, 0, os.SEEK_END)  # only records from now on
        except OSError as exc:
            self.fd = None
            self.unavailable = f"kernel log not readable ({self.path}: {exc.strerror})"
            return False
        return True

    def poll(self) -> list[ParsedLine]:
        """Every record available now, parsed, with wall-clock times."""
        if self.fd is None:
            return []
        records: list[ParsedLine] = []
        while True:
            try:
                raw = os.read(self.fd, KMSG_RECORD_MAX)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # the ring overwrote records we had not read
                    self.lost_records += 1
                    continue
                break
            if not raw:
                break
            head, _, _ = raw.partition(b"\n")  # continuation lines (KEY=value) follow
            parsed = parse_line(head)
            prefix = parse_prefix(head)
            if prefix is not None:
                parsed.ts_ns = wall_ns_from_usec(prefix.usec)
            records.append(parsed)
        return records

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass(slots=True)
class MemoryCounters:
    oom_kill: int = 0
    oom: int = 0
    failcnt: int = 0


def _read_keyed(path: Path) -> dict[str, int]:
    values: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return values
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    return values


class CgroupMemoryWatch:
    """OOM kills in the memory cgroup of a process, between `start()` and `finish()`."""

    def __init__(self, pid: int, *, procfs: str = "/proc", sysfs: str = "/sys") -> None:
        self.pid = pid
        self.procfs = procfs
        self.cgroup_root = Path(sysfs) / "fs" / "cgroup"
        self.files: tuple[str, Path] | None = None
        self.before = MemoryCounters()

    def locate(self) -> tuple[str, Path] | None:
        """('v1'|'v2', folder) of the process's memory cgroup, if there is one."""
        try:
            text = Path(self.procfs, str(self.pid), "cgroup").read_text()
        except OSError:
            return None
        v2_path = None
        for line in text.splitlines():
            parts = line.split(":", 2)
            if len(parts) != 3:
                continue
            _, controllers, path = parts
            if "memory" in controllers.split(","):
                folder = self.cgroup_root / "memory" / path.lstrip("/")
                if (folder / "memory.oom_control").exists():
                    return "v1", folder
            if controllers == "":
                v2_path = path
        if v2_path is not None:
            folder = self.cgroup_root / v2_path.lstrip("/")
            if (folder / "memory.events").exists():
                return "v2", folder
        return None

    def read(self) -> MemoryCounters:
        if self.files is None:
            return MemoryCounters()
        version, folder = self.files
        if version == "v2":
            events = _read_keyed(folder / "memory.events")
            return MemoryCounters(events.get("oom_kill", 0), events.get("oom", 0))
        control = _read_keyed(folder / "memory.oom_control")
        try:
            failcnt = int((folder / "memory.failcnt").read_text().strip() or 0)
        except (OSError, ValueError):
            failcnt = 0
        return MemoryCounters(control.get("oom_kill", 0), 0, failcnt)

    def start(self) -> bool:
        self.files = self.locate()
        self.before = self.read()
        return self.files is not None

    def finish(self, evidence_id: str, host: str | None, pid: int | None = None) -> Evidence | None:
        """Evidence of OOM kills in the cgroup since start(), or None."""
        if self.files is None:
            return None
        after = self.read()
        kills = after.oom_kill - self.before.oom_kill
        if kills <= 0:
            return None
        version, folder = self.files
        relative = folder.relative_to(self.cgroup_root)
        body = (
            f"memory cgroup /{relative} ({version}): oom_kill {self.before.oom_kill} -> "
            f"{after.oom_kill} during the run"
        )
        return Evidence(
            id=evidence_id,
            event=Event(
                body=body,
                ts_ns=time.time_ns(),
                host=host,
                source="cgroup",
                kind="state",
                pid=pid or self.pid,
                attrs={"oom_kill": kills},
            ),
            signature=CGROUP_OOM_SIGNATURE,
            category="host.oom_killed",
            severity="critical",
            captures={"count": str(kills)},
            summary=f"the OOM killer killed {kills} process(es) in the job's memory cgroup",
            action="reduce_memory",
        )


class RunHostWatch:
    """The host evidence of one `denpex run`, set up before the job starts so that nothing
    it triggers is missed: the kernel log read from this point on, and the OOM-kill count of
    the memory cgroup the job will inherit from denpex."""

    def __init__(self, *, procfs: str = "/proc", sysfs: str = "/sys", devfs: str = "/dev") -> None:
        self.notes: list[str] = []
        self.kmsg: KmsgWatch | None = KmsgWatch(devfs)
        if not self.kmsg.open():
            self.notes.append(self.kmsg.unavailable or "kernel log not readable")
            self.kmsg = None
        self.cgroup: CgroupMemoryWatch | None = CgroupMemoryWatch(
            os.getpid(), procfs=procfs, sysfs=sysfs
        )
        if not self.cgroup.start():
            self.notes.append("no memory cgroup found: OOM kills of the job cannot be counted")
            self.cgroup = None
