"""`python -m denpex.catalog.check [PATH ...]`: validate a catalog and run all its examples.

Prints every problem as file:line and exits 1 when there is any; the same checks the test
suite runs, for catalog authors.
"""

from __future__ import annotations

import sys

from denpex.catalog.catalog import Catalog
from denpex.catalog.loader import CatalogError, load_signatures


def check(paths: list[str] | None) -> list[str]:
    try:
        signatures = load_signatures(paths)
    except CatalogError as exc:
        return exc.errors
    return Catalog(signatures).example_errors()


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
