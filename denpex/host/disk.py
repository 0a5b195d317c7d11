"""Free space and inodes of the filesystems a training job writes to: /dev/shm and the
configured checkpoint and scratch folders.

One `statvfs` per path per poll, nothing else: never walks a tree, never writes. A path that
does not exist is reported once (a state event), not as an error every poll.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from denpex.core.collector import CollectContext, Observation
from denpex.core.events import Event, metric
from denpex.core.roots import Roots
from denpex.host.base import HostCollector

SHM = "/dev/shm"
LEVELS = ("ok", "warning", "error")

HELP = {
    "disk_avail_bytes": "Bytes available to unprivileged writers on the path's filesystem",
    "disk_size_bytes": "Size of the path's filesystem",
    "disk_avail_ratio": "Available share of the filesystem (the lower of bytes and inodes)",
    "disk_inodes_free": "Inodes available on the path's filesystem",
    "disk_inodes": "Inodes of the path's filesystem",
}


@dataclass(frozen=True, slots=True)
class Usage:
    avail_bytes: int
    size_bytes: int
    inodes_free: int
    inodes: int

    @property
    def avail_ratio(self) -> float:
        """The lower of free space and free inodes: either one running out stops writes."""
        ratios = [self.avail_bytes / self.size_bytes if self.size_bytes else 1.0]
        if self.inodes:  # some filesystems (btrfs, some FUSE) report 0 inodes: no limit
            ratios.append(self.inodes_free / self.inodes)
        return min(ratios)


def usage_from_statvfs(st: os.statvfs_result) -> Usage:
    return Usage(
        avail_bytes=st.f_bavail * st.f_frsize,
        size_bytes=st.f_blocks * st.f_frsize,
        inodes_free=st.f_favail,
        inodes=st.f_files,
    )


def fill_level(avail_ratio: float, warning_ratio: float, error_ratio: float) -> str:
    """ "error" below the critical free ratio, "warning" below the warning one, else "ok"."""
    if avail_ratio < error_ratio:
        return "error"
    if avail_ratio < warning_ratio:
        return "warning"
    return "ok"


def detector_for(path: str) -> str:
    """/dev/shm running full is shared memory exhausted; any other path, a full disk."""
    if path.rstrip("/") == SHM:
        return "host.shm_exhausted.low_free_space"
    return "host.disk_full.low_free_space"


class DiskCollector(HostCollector):
    name = "disk"
    stability = "stable"
    default_interval_s = 30.0
    default_budget_s = 1.0
    metrics_help = HELP

    def __init__(self, roots: Roots, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(roots, options)
        self._level: dict[str, str] = {}

    def watched(self) -> dict[str, Path]:
        """Configured name → the path to stat; /dev paths go through the devfs root."""
        paths = self.options.get("paths")
        names = [
            *(paths if paths is not None else [SHM]),
            *(self.options.get("checkpoint_dirs") or []),
        ]
        result = {}
        for name in names:
            name = str(name)
            if name == "/dev" or name.startswith("/dev/"):
                result[name] = self.roots.dev(*Path(name).parts[2:])
            else:
                result[name] = Path(name)
        return result

    def available(self) -> tuple[bool, str]:
        return True, "statvfs of " + ", ".join(self.watched())

    def collect(self, ctx: CollectContext) -> list[Observation]:
        out: list[Observation] = []
        for name, path in self.watched().items():
            try:
                usage = usage_from_statvfs(os.statvfs(path))
            except OSError as exc:
                if self.edges.first(("missing", name)):
                    out.append(
                        Event(
                            body=f"disk path {name} cannot be checked ({exc.strerror}); "
                            "reported once, checked again every poll",
                            ts_ns=ctx.now_ns,
                            host=ctx.host,
                            source="disk",
                            kind="state",
                            attrs={"path": name},
                        )
                    )
                continue
            self.edges.clear(("missing", name))
            out += self._observe(ctx, name, usage)
        return out

    def _observe(self, ctx: CollectContext, name: str, usage: Usage) -> list[Observation]:
        labels = {"path": name}
        out: list[Observation] = [
            metric(
                metric_name, value, source="disk", labels=labels, host=ctx.host, ts_ns=ctx.now_ns
            )
            for metric_name, value in (
                ("disk_avail_bytes", usage.avail_bytes),
                ("disk_size_bytes", usage.size_bytes),
                ("disk_avail_ratio", usage.avail_ratio),
                ("disk_inodes_free", usage.inodes_free),
                ("disk_inodes", usage.inodes),
            )
        ]
        level = fill_level(
            usage.avail_ratio,
            float(self.options.get("warning_free_ratio", 0.10)),
            float(self.options.get("error_free_ratio", 0.02)),
        )
        before = self._level.get(name, "ok")
        self._level[name] = level
        if LEVELS.index(level) <= LEVELS.index(before):
            return out  # report a path once per step down, again after it recovered
        out.append(
            self.finding(
                ctx,
                detector_for(name),
                attrs={"path": name},
                severity=level,
                captures={
                    "path": name,
                    "avail_bytes": str(usage.avail_bytes),
                    "size_bytes": str(usage.size_bytes),
                    "inodes_free": str(usage.inodes_free),
                    "inodes": str(usage.inodes),
                    "avail_ratio": f"{usage.avail_ratio:.4f}",
                },
                values={"used_ratio": 1 - usage.avail_ratio},
            )
        )
        return out
