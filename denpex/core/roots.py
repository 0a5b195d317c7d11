"""The filesystem roots every host read goes through (`--procfs`, `--sysfs`, `--devfs`).

Collectors never open `/proc/...` literally: they ask `Roots` for the path, so tests point
the same code at recorded fixture trees.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Roots:
    procfs: str = "/proc"
    sysfs: str = "/sys"
    devfs: str = "/dev"

    def proc(self, *parts: str | int) -> Path:
        return Path(self.procfs, *map(str, parts))

    def sys(self, *parts: str | int) -> Path:
        return Path(self.sysfs, *map(str, parts))

    def dev(self, *parts: str | int) -> Path:
        return Path(self.devfs, *map(str, parts))

    def cgroup(self, *parts: str) -> Path:
        """A path under the cgroup mount (`<sysfs>/fs/cgroup`); leading '/' of parts ignored."""
        return Path(self.sysfs, "fs", "cgroup", *(p.lstrip("/") for p in parts if p))


def read_text(path: Path) -> str | None:
    """The file's text, or None when it does not exist or cannot be read."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
