"""The built-in catalog as the loader last validated it and the native matcher last planned
it, so that a command's start does neither again (YAML, the regex checks, the prefilter's
literals and context programs: ~0.6 s of each `denpex scan`, `run` or `agent`).

One JSON file under the cache folder (denpex.core.caches), named by a digest of everything
the result depends on: the catalog files' names and bytes, the taxonomy, the detector
catalog, the source of the validating and planning code, the matcher in use, denpex's and
Python's versions, and holding a checksum of its own content. A change to any
of them names another file, so a stale copy is never read; a missing, unreadable or foreign
file is rebuilt by validating, and one that cannot be written is no error (the next start
validates again). JSON, not pickle: reading a cache file never runs code.

Site-local signature folders are never cached: they are validated at every start, as the
author editing them expects.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

import denpex
import denpex._native as native
from denpex._native.contexts import MatcherPlan
from denpex._native.linesearch import LineSearch
from denpex.catalog.loader import display_name
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
    "denpex._native.contexts",  # and the matcher's plan
    "denpex.core.scan_cues",  # planned after the signatures
)
# what a Signature keeps from validation: all its fields but where it was read from (`file`,
# shown to people relative to the working folder, so computed again at each load), the entry
# it overrides (never, in the shipped catalog) and its compiled pattern
_STORED = tuple(
    f.name for f in fields(Signature) if f.name not in ("file", "overrides", "compiled")
)


@dataclass(slots=True)
class Kept:
    """What the cache held: the validated signatures, and the native matcher's plan of their
    patterns when a native matcher was built on them (None after the reference one)."""

    signatures: list[Signature]
    plan: MatcherPlan | None


def read(files: list[Path], folder: Path | None = None) -> Kept | None:
    """The kept copy of the catalog `files`, or None when there is none (or none for these
    files, this code and these versions)."""
    try:
        digest = _digest(files)  # an unreadable catalog file: validation says so
        data = orjson.loads(_path(folder, digest).read_bytes())
        body = data["body"]
        if (
            data.get("format") != FORMAT
            or data.get("digest") != digest
            or data.get("check") != hashlib.sha256(orjson.dumps(body)).hexdigest()
        ):
            return None
        plan = MatcherPlan.from_data(body["plan"]) if body["plan"] is not None else None
        return Kept([_signature(row, files) for row in body["signatures"]], plan)
    except (OSError, orjson.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError,
            ValueError):  # fmt: skip
        return None  # absent, torn or not ours: validate again


def write(
    files: list[Path],
    signatures: list[Signature],
    plan: MatcherPlan | None,
    folder: Path | None = None,
) -> None:
    """Keep `signatures` (validated from `files`) and their matcher's plan; never raises for
    a folder that cannot be written (the next start validates again)."""
    digest = _digest(files)
    index = {display_name(p): i for i, p in enumerate(files)}
    rows = []
    for signature in signatures:
        row: dict[str, Any] = {name: getattr(signature, name) for name in _STORED}
        row["file"] = index[signature.file]
        rows.append(row)
    body = {"signatures": rows, "plan": plan.to_data() if plan is not None else None}
    check = hashlib.sha256(orjson.dumps(body)).hexdigest()
    blob = orjson.dumps({"format": FORMAT, "digest": digest, "check": check, "body": body})
    caches.replace_file(_path(folder, digest), blob, stale="catalog-*.json")


def _path(folder: Path | None, digest: str) -> Path:
    return (folder or caches.cache_dir("catalog")) / f"catalog-{digest[:32]}.json"


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256(f"{FORMAT}\0{denpex.__version__}\0{sys.version_info[:2]}".encode())
    for path in files:
        h.update(f"\0{path.parent.name}/{path.name}\0".encode())
        h.update(path.read_bytes())
    core = resources.files("denpex.core")
    for name in ("taxonomy.yaml", CATALOG_FILE):
        h.update(core.joinpath(name).read_bytes())
    for module in _VALIDATING_CODE:
        h.update(caches.source_identity(module))
    h.update(caches.source_identity(native.load("matcher").__name__))  # the plan's reader
    return h.hexdigest()


def _signature(row: dict[str, Any], files: list[Path]) -> Signature:
    values = {name: row[name] for name in _STORED}
    values["sources"], values["flags"] = tuple(values["sources"]), tuple(values["flags"])
    signature = Signature(**values, file=display_name(files[row["file"]]))
    signature.compiled = LineSearch(signature.pattern)
    return signature
