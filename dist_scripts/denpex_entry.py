"""Entry script of the frozen `denpex` binary: the same `main` as the console script.

Kept outside the package so PyInstaller analyses the installed denpex, never a source tree.
"""

from denpex.cli.main import main

raise SystemExit(main())
