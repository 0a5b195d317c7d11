"""`python -m denpex`: the same entry point as the `denpex` console script."""

from denpex.cli.main import main

raise SystemExit(main())
