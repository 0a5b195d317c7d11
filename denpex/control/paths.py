"""Where the control plane and its clients keep state on this host (standard library only:
the report client imports it inside `denpex run`)."""

from __future__ import annotations

import os
from pathlib import Path


def default_state_dir() -> Path:
    """DENPEX_STATE_DIR, else /var/lib/denpex as root, else the XDG state dir."""
    env = os.environ.get("DENPEX_STATE_DIR")
    if env:
        return Path(env)
    if os.geteuid() == 0:
        return Path("/var/lib/denpex")
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "denpex"
