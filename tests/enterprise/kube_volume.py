"""A Kubernetes secret volume as the kubelet lays it out (pkg/volume/util/atomic_writer.go):
the payload in a hidden timestamped folder `..2026_12_02_00_40_12.123456789`, a `..data`
symlink to it, and each key a symlink `KEY -> ..data/KEY`. An update writes a new timestamped
folder, points `..data_tmp` at it, renames `..data_tmp` over `..data` (the one atomic step),
adds and removes the key links, then deletes the old folder — so a reader sees the old or
the new payload, never a mix, and a file it opened just before the swap may vanish."""

from __future__ import annotations

import datetime
import os
import shutil
from pathlib import Path


class SecretVolume:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self.writes = 0

    def write(self, payload: dict[str, str]) -> None:
        self.writes += 1
        stamp = datetime.datetime.now(datetime.UTC).strftime("..%Y_%m_%d_%H_%M_%S.%f")
        folder = self.path / f"{stamp}{self.writes:03d}"
        folder.mkdir(mode=0o755)
        for key, value in payload.items():
            (folder / key).write_text(value)
            (folder / key).chmod(0o644)  # the Secret volume's defaultMode 0644
        data = self.path / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        tmp = self.path / "..data_tmp"
        os.symlink(folder.name, tmp)
        os.rename(tmp, data)
        for key in payload:
            link = self.path / key
            if not link.is_symlink():
                os.symlink(f"..data/{key}", link)
        for entry in self.path.iterdir():
            if not entry.name.startswith(".") and entry.name not in payload:
                entry.unlink()
        if old is not None:
            shutil.rmtree(self.path / old)
