"""The environment a wrapped command runs with: the same as denpex's own.

It must never add, drop or rewrite a variable, except undoing what a PyInstaller bootloader
did to `LD_LIBRARY_PATH` (the child must load its libraries, not the ones frozen in denpex).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

_LD = "LD_LIBRARY_PATH"
_LD_ORIG = "LD_LIBRARY_PATH_ORIG"


def child_environ(
    environ: Mapping[str, str] | None = None, *, frozen: bool | None = None
) -> dict[str, str]:
    """Return the environment for the child: a copy of `environ` (default: ours).

    When denpex runs frozen by PyInstaller (`sys.frozen` set), `LD_LIBRARY_PATH` is restored
    from `LD_LIBRARY_PATH_ORIG` (what the user had before the bootloader changed it), or
    removed when the user had none.
    """
    env = dict(os.environ if environ is None else environ)
    if frozen is None:
        frozen = bool(getattr(sys, "frozen", False))
    if frozen:
        orig = env.pop(_LD_ORIG, None)
        if orig is None:
            env.pop(_LD, None)
        else:
            env[_LD] = orig
    return env
