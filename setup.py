"""Declares denpex's Cython extensions (everything else lives in pyproject.toml).

Each module in `_native/` compiles to `denpex._native.<name>`. When Cython or a C compiler
is missing, or DENPEX_NO_EXTENSIONS=1 is set, the build still succeeds and denpex runs on
the pure-Python twins `denpex._native.<name>_ref`.
"""

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

NATIVE_DIR = Path("_native")


class OptionalBuildExt(build_ext):
    """Builds the extensions, but a failed compile falls back to pure Python, loudly."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            self._warn(exc)

    def build_extension(self, ext) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._warn(exc, ext.name)

    @staticmethod
    def _warn(exc: Exception, name: str = "extensions") -> None:
        print(
            f"WARNING: building {name} failed ({exc}); denpex will use its pure-Python "
            "reference modules instead.",
            file=sys.stderr,
        )


def native_extensions() -> list:
    if os.environ.get("DENPEX_NO_EXTENSIONS") == "1":
        return []
    try:
        from Cython.Build import cythonize
        from setuptools import Extension
    except ImportError:
        print("WARNING: Cython not found; building pure-Python denpex.", file=sys.stderr)
        return []
    extensions = [
        Extension(
            f"denpex._native.{pyx.stem}",
            [str(pyx)],
            extra_compile_args=["-O3"],
        )
        for pyx in sorted(NATIVE_DIR.glob("*.pyx"))
    ]
    return cythonize(
        extensions,
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
        quiet=True,
    )


setup(ext_modules=native_extensions(), cmdclass={"build_ext": OptionalBuildExt})
