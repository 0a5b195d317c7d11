"""Declares denpex's Cython extensions and the eBPF object build (everything else lives in
pyproject.toml).

Each module in `_native/` compiles to `denpex._native.<name>`. When Cython or a C compiler
is missing, or DENPEX_NO_EXTENSIONS=1 is set, the build still succeeds and denpex runs on
the pure-Python twins `denpex._native.<name>_ref`. Likewise `bpf/*.bpf.c` compile to
`denpex/host/bpf/*.bpf.o` only when clang, bpftool and kernel BTF exist.
"""

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

NATIVE_DIR = Path("_native")
BPF_BUILD = Path("bpf", "build.py")


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


def build_bpf_objects() -> None:
    """Compiles the eBPF programs into denpex/host/bpf/ (package data) when it can; never fails."""
    if os.environ.get("DENPEX_NO_BPF") == "1" or not BPF_BUILD.exists():
        return
    spec = importlib.util.spec_from_file_location("denpex_bpf_build", BPF_BUILD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lacking = module.missing()
    if lacking:
        print(f"eBPF objects not built: missing {lacking}", file=sys.stderr)
        return
    try:
        module.build()
    except Exception as exc:
        print(
            f"WARNING: building the eBPF objects failed ({exc}); the ebpf collector will "
            "report them as not built.",
            file=sys.stderr,
        )


class BuildPyWithBpf(build_py):
    """build_py that first writes the eBPF objects, so they are copied as package data."""

    def run(self) -> None:
        build_bpf_objects()
        super().run()


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


setup(
    ext_modules=native_extensions(),
    cmdclass={"build_ext": OptionalBuildExt, "build_py": BuildPyWithBpf},
)
