"""`python -m denpex.catalog.check [PATH ...]`: validate a catalog and run all its examples.

Prints every problem as file:line and exits 1 when there is any: schema errors, examples
that disagree with the matcher, examples claimed by a signature of another category (unless
listed in `overlaps.yaml` beside the catalog), and regexes RE2 rejects (when `google-re2` is
installed; it proves the portable subset).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from denpex.catalog.catalog import Catalog
from denpex.catalog.loader import CatalogError, builtin_catalog_files, load_signatures
from denpex.catalog.schema import Signature

OVERLAPS_FILE = "overlaps.yaml"
FALLBACK_CATEGORY = "app.exception"


def accepted_overlaps(paths: list[str] | None) -> set[tuple[str, str]]:
    """(signature id, other category) pairs allowed to share an example, from overlaps.yaml:
    a list of {id: ..., also: [category, ...], why: ...}."""
    roots = (
        [builtin_catalog_files()[0].parent.parent] if paths is None else [Path(p) for p in paths]
    )
    accepted: set[tuple[str, str]] = set()
    for root in roots:
        path = root / OVERLAPS_FILE if root.is_dir() else root.parent / OVERLAPS_FILE
        if path.is_file():
            for entry in yaml.safe_load(path.read_text()) or []:
                accepted.update((entry["id"], category) for category in entry.get("also", []))
    return accepted


def overlap_problems(catalog: Catalog, accepted: set[tuple[str, str]]) -> list[str]:
    """Examples of one signature that a signature of a *different* category also matches."""
    problems: list[str] = []
    for sig in catalog.signatures:
        for text in sig.examples_match:
            for match in catalog.match_lines([text.encode("utf-8")]):
                other = match.signature
                if other.category in (sig.category, FALLBACK_CATEGORY):
                    continue  # app.exception is the fallback: it may claim any exception line
                if (sig.id, other.category) in accepted:
                    continue
                problems.append(
                    f"{sig.file}:{sig.line}: {sig.id}: example {text!r} is also claimed by "
                    f"{other.id} ({other.category}); narrow one, or accept it in {OVERLAPS_FILE}"
                )
    return problems


def re2_problems(signatures: list[Signature]) -> list[str]:
    """Regexes outside RE2's syntax, or whose examples RE2 judges differently."""
    try:
        import re2
    except ImportError:
        return []
    problems: list[str] = []
    for sig in signatures:
        options = re2.Options()
        options.case_sensitive = "ignorecase" not in sig.flags
        try:
            compiled = re2.compile(sig.regex, options)
        except re2.error as exc:
            problems.append(f"{sig.file}:{sig.line}: {sig.id}: RE2 rejects the regex: {exc}")
            continue
        for text in sig.examples_match:
            if compiled.search(text) is None:
                problems.append(f"{sig.file}:{sig.line}: {sig.id}: RE2 does not match {text!r}")
        for text in sig.examples_no_match:
            if compiled.search(text) is not None:
                problems.append(f"{sig.file}:{sig.line}: {sig.id}: RE2 matches {text!r}")
    return problems


def check(paths: list[str] | None, *, local: list[str] | None = None) -> list[str]:
    """Every problem of the catalog at `paths` (default: the shipped one) plus `local`."""
    try:
        signatures = load_signatures(paths, local=local or ())
    except CatalogError as exc:
        return exc.errors
    catalog = Catalog(signatures)
    accepted = (
        accepted_overlaps(paths) | accepted_overlaps(local) if local else accepted_overlaps(paths)
    )
    return [
        *catalog.example_errors(),
        *overlap_problems(catalog, accepted),
        *re2_problems(signatures),
    ]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    problems = check(args or None)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s)", file=sys.stderr)
        return 1
    count = len(load_signatures(args or None))
    print(f"catalog OK: {count} signatures, every example agrees with the matcher")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
