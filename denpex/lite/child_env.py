"""The environment a wrapped command runs with: the same as denpex's own.

It must never add, drop or rewrite a variable, except undoing what the bootloaders of a
frozen denpex did (`LD_LIBRARY_PATH`: the child must load its libraries, not the ones frozen
in denpex; `_PYI_*`, `STATICX_*`: a frozen child would take them for its own) and adding what
the caller names in `extra` (the SDK socket's address).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

_LD = "LD_LIBRARY_PATH"
_LD_ORIG = "LD_LIBRARY_PATH_ORIG"
# set by the PyInstaller bootloader (_PYI_*) and by staticx's (STATICX_*), never by a user
_BOOTLOADER_PREFIXES = ("_PYI_", "STATICX_BUNDLE_DIR", "STATICX_PROG_PATH")


def child_environ(
    environ: Mapping[str, str] | None = None,
    *,
    frozen: bool | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Return the environment for the child: a copy of `environ` (default: ours).

    When denpex runs frozen by PyInstaller (`sys.frozen` set), `LD_LIBRARY_PATH` is restored
    from `LD_LIBRARY_PATH_ORIG` (what the user had before the bootloader changed it), or
    removed when the user had none, and the bootloaders' own variables are removed.
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
        for name in [n for n in env if n.startswith(_BOOTLOADER_PREFIXES)]:
            del env[name]
    env.update(extra or {})
    return env
