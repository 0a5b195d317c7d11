"""The built-in catalog as the loader last validated it, so that a command's start does not
parse and validate every entry again (YAML, the regex checks, the literal plans: ~0.4 s of
each `denpex scan`, `run` or `agent`).

One JSON file under the cache folder (denpex.core.caches), named by a digest of everything
the result depends on: the catalog files' names and bytes, the taxonomy, the detector
catalog, the source of the validating code, denpex's and Python's versions. A change to any
of them names another file, so a stale copy is never read; a missing, unreadable or foreign
file is rebuilt by validating, and one that cannot be written is no error (the next start
validates again). JSON, not pickle: reading a cache file never runs code.

Site-local signature folders are never cached: they are validated at every start, as the
author editing them expects.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

import denpex
from denpex._native.linesearch import LineSearch
from denpex.catalog.loader import builtin_catalog_files, display_name, load_signatures
from denpex.catalog.schema import Signature
from denpex.core import caches
from denpex.core.detectors import CATALOG_FILE

FORMAT = 1
# the code whose checks decide which entries are valid and what a Signature holds
_VALIDATING_CODE = (
    "denpex.catalog.schema",
    "denpex.catalog.loader",
    "denpex.core.entries",
    "denpex.core.taxonomy",
    "denpex.core.detectors",
    "denpex._native.literals",
)
# what a Signature keeps from validation; `file` is where it was read from (shown to people
# relative to the working folder, so computed again at each load) and `compiled` its pattern
_STORED = (
    "id",
    "category",
    "severity",
    "regex",
    "summary",
    "action",
    "explain",
    "refs",
    "examples_match",
    "examples_no_match",
    "sources",
    "flags",
    "line",
)


def builtin_signatures(
    files: list[Path] | None = None,
    validate: Callable[[list[Path]], list[Signature]] | None = None,
    folder: Path | None = None,
) -> list[Signature]:
    """The signatures of `files` (default: the shipped catalog), from the cache when it
    holds them, else validated by `validate` (default: the loader) and stored for next time.
    Raises CatalogError as validation does."""
    files = builtin_catalog_files() if files is None else files
    validate = validate or (lambda paths: load_signatures(paths))
    folder = folder or caches.cache_dir("catalog")
    digest = _digest(files)
    path = folder / f"catalog-{digest[:32]}.json"
    cached = _read(path, digest, files)
    if cached is not None:
        return cached
    signatures = validate(files)
    _write(path, digest, files, signatures)
    return signatures


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256(f"{FORMAT}\0{denpex.__version__}\0{sys.version_info[:2]}".encode())
    for path in files:
        h.update(f"\0{path.parent.name}/{path.name}\0".encode())
        h.update(path.read_bytes())
    core = resources.files("denpex.core")
    for name in ("taxonomy.yaml", CATALOG_FILE):
        h.update(core.joinpath(name).read_bytes())
    for module in _VALIDATING_CODE:
        h.update(_source_identity(module))
    return h.hexdigest()


def _source_identity(module: str) -> bytes:
    """A module's source; in a frozen binary (no source files) the binary's size and time."""
    try:
        return Path(importlib.import_module(module).__file__ or "").read_bytes()
    except OSError:
        stat = os.stat(sys.executable)
        return f"{sys.executable}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()


def _read(path: Path, digest: str, files: list[Path]) -> list[Signature] | None:
    try:
        data = orjson.loads(path.read_bytes())
        if data.get("format") != FORMAT or data.get("digest") != digest:
            return None
        return [_signature(row, files) for row in data["signatures"]]
    except (OSError, orjson.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError):
        return None  # absent, torn or not ours: validate again


def _signature(row: dict[str, Any], files: list[Path]) -> Signature:
    fields = {name: row[name] for name in _STORED}
    fields["sources"], fields["flags"] = tuple(fields["sources"]), tuple(fields["flags"])
    signature = Signature(**fields, file=display_name(files[row["file"]]))
    signature.compiled = LineSearch(signature.pattern)
    return signature


def _write(path: Path, digest: str, files: list[Path], signatures: list[Signature]) -> None:
    index = {display_name(p): i for i, p in enumerate(files)}
    rows = []
    for signature in signatures:
        row: dict[str, Any] = {name: getattr(signature, name) for name in _STORED}
        row["file"] = index[signature.file]
        rows.append(row)
    blob = orjson.dumps({"format": FORMAT, "digest": digest, "signatures": rows})
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".catalog-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(blob)
            os.replace(temporary, path)  # whole or not at all, whoever else writes it
        except BaseException:
            os.unlink(temporary)
            raise
        for old in path.parent.glob("catalog-*.json"):  # the copies of earlier catalogs
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only or full cache folder: the next start validates again
