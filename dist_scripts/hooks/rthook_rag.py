"""Runtime hook of the frozen denpex: the optional retrieval folder joins `sys.path`.

The `rag` extra (onnxruntime, tokenizers, numpy, the embedding model) is too big for the core
binary, so build_binary.sh installs it into its own folder, `denpex-rag/`. When that folder
sits beside the binary (or its folder), or DENPEX_RAG_DIR names it, its packages import as if
installed; without it denpex runs with keyword retrieval and says so (`--version --verbose`).
Never fails start-up and never adds a folder that does not exist.
"""

import os
import sys


def _program() -> str:
    """The file the user started: staticx runs the real binary from a temporary folder."""
    bundle = os.environ.get("STATICX_BUNDLE_DIR")
    prog = os.environ.get("STATICX_PROG_PATH")
    if bundle and prog and os.path.realpath(sys.executable).startswith(os.path.realpath(bundle)):
        return prog
    return sys.executable


def _rag_folder() -> str | None:
    given = os.environ.get("DENPEX_RAG_DIR")
    if given:
        return given if os.path.isdir(given) else None
    here = os.path.dirname(os.path.realpath(_program()))
    for folder in (
        os.path.join(here, "denpex-rag"),
        os.path.join(os.path.dirname(here), "denpex-rag"),
    ):
        if os.path.isdir(folder):
            return folder
    return None


try:
    _folder = _rag_folder()
    if _folder is not None and _folder not in sys.path:
        sys.path.append(_folder)
except Exception:  # never stop denpex from starting
    pass
