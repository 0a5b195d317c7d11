"""Where denpex keeps what it can rebuild on this host (standard library only): a folder
that may be deleted at any time and whose files are only ever a faster way to an answer."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """DENPEX_CACHE_DIR, else $XDG_CACHE_HOME/denpex, else ~/.cache/denpex; then `parts`."""
    base = os.environ.get("DENPEX_CACHE_DIR")
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "denpex")
    return Path(base, *parts)


def replace_file(path: Path, data: bytes, *, stale: str | None = None) -> bool:
    """Write `data` to `path` whole or not at all (a temporary file renamed over it, so a
    reader never sees half of it, whoever else writes it at the same time), then delete the
    files of its folder matching the glob `stale` (earlier versions of it). False when the
    folder cannot be written: a cache that cannot be kept is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(temporary, path)
        except BaseException:
            os.unlink(temporary)
            raise
        for old in path.parent.glob(stale) if stale else ():
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        return False
    return True


def source_identity(module: str) -> bytes:
    """What names the code of `module` for a cache key: its source file's bytes, or in a
    frozen binary (no source files) the binary's path, size and time."""
    try:
        return Path(importlib.import_module(module).__file__ or "").read_bytes()
    except OSError:
        stat = os.stat(sys.executable)
        return f"{sys.executable}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()
