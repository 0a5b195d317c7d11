"""Loads the signature catalog from YAML files and validates all of it in one pass.

Errors are collected across every file and entry and raised together as `CatalogError`, each
as `file:line: message`, so an author sees every problem at once.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from denpex.catalog.schema import Signature, validate_entry
from denpex.core.detectors import DetectorCatalogError, detector_catalog
from denpex.core.entries import read_entries
from denpex.core.taxonomy import Taxonomy, load_taxonomy


class CatalogError(Exception):
    """The catalog has problems; `errors` lists each as 'file:line: message'."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        shown = "\n".join(errors[:50])
        more = f"\n… and {len(errors) - 50} more" if len(errors) > 50 else ""
        super().__init__(f"{len(errors)} problem(s) in the signature catalog:\n{shown}{more}")


def builtin_catalog_files() -> list[Path]:
    """The YAML files shipped in the `denpex.signatures` package (a real folder on disk)."""
    root = Path(str(resources.files("denpex.signatures")))
    return sorted(root.glob("*/*.yaml"))


def _expand(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(path.rglob("*.yaml")))
        else:
            files.append(path)
    return files


def display_name(path: Path) -> str:
    """How a catalog file is named in messages: relative to the working folder, else by its
    last two parts."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        parts = path.parts
        return "/".join(parts[-2:]) if len(parts) >= 2 else str(path)


def load_file(path: Path, taxonomy: Taxonomy) -> tuple[list[Signature], list[str]]:
    """The valid signatures of one file and the problems found in it."""
    name = display_name(path)
    try:
        text = path.read_text("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [], [f"{name}:0: cannot read: {exc}"]
    entries, errors = read_entries(text, name)
    signatures: list[Signature] = []
    for entry in entries:
        data = entry.data
        signature, problems = validate_entry(data, entry.key_lines, entry.line, taxonomy)
        label = data.get("id", "?") if isinstance(data, dict) else "?"
        errors.extend(f"{name}:{ln}: {label}: {message}" for ln, message in sorted(problems))
        if signature is not None:
            signature.file = name
            signatures.append(signature)
    return signatures, errors


def _load_group(files: list[Path], taxonomy: Taxonomy, errors: list[str]) -> list[Signature]:
    signatures: list[Signature] = []
    for path in files:
        found, problems = load_file(path, taxonomy)
        signatures.extend(found)
        errors.extend(problems)
    try:
        detectors = detector_catalog()
    except DetectorCatalogError as exc:
        errors.extend(exc.errors)
        detectors = {}
    seen: dict[str, Signature] = {}
    for signature in signatures:
        if signature.id in detectors:
            taken = detectors[signature.id]
            errors.append(
                f"{signature.file}:{signature.line}: {signature.id}: is a detector id "
                f"({taken.file}:{taken.line}); a signature needs an id of its own"
            )
        first = seen.setdefault(signature.id, signature)
        if first is not signature:
            errors.append(
                f"{signature.file}:{signature.line}: {signature.id}: duplicate id "
                f"(first defined at {first.file}:{first.line})"
            )
    return signatures


def load_signatures(
    paths: Iterable[str | os.PathLike[str]] | None = None,
    taxonomy: Taxonomy | None = None,
    *,
    local: Iterable[str | os.PathLike[str]] = (),
) -> list[Signature]:
    """Every signature of the given files/folders (default: the built-in catalog), then the
    site-local ones from `local`: a local entry with a shipped entry's id replaces it (in
    place), the others are added. Raises CatalogError listing every problem at once."""
    taxonomy = taxonomy or load_taxonomy()
    files = builtin_catalog_files() if paths is None else _expand(paths)
    errors: list[str] = []
    if not files:
        errors.append("no signature files found")
    signatures = _load_group(files, taxonomy, errors)
    local_files = _expand(local)
    for folder in local:
        if not Path(folder).exists():
            errors.append(f"{folder}:0: site-local signature folder does not exist")
    if local_files:
        position = {s.id: index for index, s in enumerate(signatures)}
        for signature in _load_group(local_files, taxonomy, errors):
            if signature.id in position:
                signature.overrides = signatures[position[signature.id]].file
                signatures[position[signature.id]] = signature
            else:
                signatures.append(signature)
    if errors:
        raise CatalogError(errors)
    return signatures
