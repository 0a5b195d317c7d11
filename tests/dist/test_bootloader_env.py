"""What a frozen denpex hands its child: the caller's environment, not its bootloaders'.

Fast, no binary needed: `child_environ(frozen=True)` on the environments that PyInstaller's
onedir/onefile bootloaders and staticx's give the frozen Python (seen in the built binaries).
"""

from __future__ import annotations

from denpex.lite.child_env import child_environ

ONEFILE_UNDER_STATICX = {
    "A": "1",
    "STATICX_BUNDLE_DIR": "/tmp/staticx-abc",
    "STATICX_PROG_PATH": "/opt/denpex/denpex-static",
    "_PYI_ARCHIVE_FILE": "/tmp/staticx-abc/denpex-onefile",
    "_PYI_PARENT_PROCESS_LEVEL": "0",
    "_PYI_LINUX_PROCESS_NAME": "denpex-onefile",
    "_PYI_APPLICATION_HOME_DIR": "/tmp/_MEI123",
    "LD_LIBRARY_PATH": "/tmp/_MEI123",
}


def test_bootloader_variables_are_removed_and_ld_library_path_unset():
    assert child_environ(ONEFILE_UNDER_STATICX, frozen=True) == {"A": "1"}


def test_callers_ld_library_path_is_restored():
    env = {**ONEFILE_UNDER_STATICX, "LD_LIBRARY_PATH_ORIG": "/opt/cuda/lib64"}
    assert child_environ(env, frozen=True) == {"A": "1", "LD_LIBRARY_PATH": "/opt/cuda/lib64"}


def test_not_frozen_keeps_everything():
    assert child_environ(ONEFILE_UNDER_STATICX, frozen=False) == ONEFILE_UNDER_STATICX


def test_a_users_own_staticx_variable_is_kept():
    env = {"STATICX_OTHER": "x", "PYI_X": "y"}
    assert child_environ(env, frozen=True) == env
