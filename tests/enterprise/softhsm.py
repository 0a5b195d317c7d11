"""A real SoftHSM2 token for the PKCS#11 KMS tests, made in a temporary folder: its own
softhsm2.conf (SOFTHSM2_CONF, set before the module is first loaded in this process), a
token initialised with softhsm2-util, the user PIN in a 0600 file."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

MODULE_CANDIDATES = (
    "/usr/lib/softhsm/libsofthsm2.so",
    "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
)
USER_PIN = "4711-0815-test"
SO_PIN = "12345678"


@dataclass(frozen=True)
class Token:
    label: str
    module: str
    pin_file: Path
    conf: Path

    def uri(self, key: str) -> str:
        return f"pkcs11:token={self.label};object={key}?module-path={self.module}&pin-source={self.pin_file}"


_MADE: list[Token] = []  # libsofthsm2 reads SOFTHSM2_CONF once per process: one token


def make_token(folder: Path, label: str = "denpex-test") -> Token:
    """The token of this test process: made in `folder` on the first call, then reused."""
    if _MADE:
        return _MADE[0]
    util = shutil.which("softhsm2-util")
    module = next((m for m in MODULE_CANDIDATES if Path(m).exists()), None)
    if util is None or module is None:
        pytest.fail(
            "SoftHSM2 is not installed: apt-get install softhsm2 (scripts/system-packages.txt)"
        )
    (folder / "tokens").mkdir(parents=True)
    conf = folder / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {folder / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    os.environ["SOFTHSM2_CONF"] = str(conf)
    subprocess.run(
        [util, "--init-token", "--free", "--label", label, "--so-pin", SO_PIN, "--pin", USER_PIN],
        check=True,
        capture_output=True,
        timeout=60,
    )
    pin_file = folder / "pin"
    pin_file.write_text(USER_PIN + "\n")
    pin_file.chmod(0o600)
    _MADE.append(Token(label, module, pin_file, conf))
    return _MADE[0]
