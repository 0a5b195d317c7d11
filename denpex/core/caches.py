"""Where denpex keeps what it can rebuild on this host (standard library only): a folder
that may be deleted at any time and whose files are only ever a faster way to an answer."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """DENPEX_CACHE_DIR, else $XDG_CACHE_HOME/denpex, else ~/.cache/denpex; then `parts`."""
    base = os.environ.get("DENPEX_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "denpex")
    return Path(base, *parts)
