"""The filesystem backend of the object store: the default, and the appliance's fallback
when no local S3 endpoint runs. Hand-written because no maintained library gives atomic,
hash-carrying object files with S3's put/get/head/list/delete semantics on a plain folder.

Each object is one file at ROOT/<key>: a one-line JSON header (size, SHA-256, content type,
time stored) and then the bytes, written to a temporary file beside it, fsynced and renamed
over the key, so a reader sees the old object or the new one, never a part. It must never
follow a key outside ROOT (TenantObjects builds the keys; this checks again).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from denpex.control.objects.model import ObjectError, ObjectInfo, ObjectNotFound, ObjectRefused

MAGIC = b"denpex.object/v1 "
_TMP = ".tmp-"


class FileBackend:
    kind = "filesystem"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.where = f"file://{self.root}"

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise ObjectError(
                f"object store {self.where}: cannot create it ({exc.strerror}); "
                "give the server a writable --objects folder"
            ) from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ObjectError(f"object store {self.where}: not writable by this user")

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            raise ObjectRefused(f"object key {key!r} is not a plain relative key")
        return self.root.joinpath(*parts)

    def put(self, key: str, data: bytes, sha256: str, content_type: str) -> ObjectInfo:
        path = self._path(key)
        info = ObjectInfo(key, len(data), sha256, content_type, time.time_ns())
        header = json.dumps(
            {"size": info.size, "sha256": sha256, "type": content_type, "ns": info.stored_ns},
            sort_keys=True,
        ).encode()
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(prefix=_TMP, dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(MAGIC + header + b"\n")
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            folder = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)  # the rename itself survives a crash
            finally:
                os.close(folder)
        except OSError as exc:
            raise ObjectError(f"object store {self.where}: writing {key}: {exc.strerror}") from None
        return info

    def _read_header(self, key: str, handle) -> ObjectInfo:  # type: ignore[no-untyped-def]
        line = handle.readline()
        if not line.startswith(MAGIC):
            raise ObjectError(f"object store {self.where}: {key} is not a denpex object file")
        meta = json.loads(line[len(MAGIC) :])
        return ObjectInfo(key, int(meta["size"]), str(meta["sha256"]), str(meta["type"]),
                          int(meta["ns"]))  # fmt: skip

    def _open(self, key: str):  # type: ignore[no-untyped-def]
        try:
            return self._path(key).open("rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(f"no object {key}") from None
        except OSError as exc:
            raise ObjectError(f"object store {self.where}: reading {key}: {exc.strerror}") from None

    def get(self, key: str) -> tuple[bytes, ObjectInfo]:
        with self._open(key) as handle:
            info = self._read_header(key, handle)
            return handle.read(), info

    def head(self, key: str) -> ObjectInfo:
        with self._open(key) as handle:
            return self._read_header(key, handle)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        folder = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not folder.is_dir():
            return
        for path in sorted(folder.rglob("*")):
            if path.is_file() and not path.name.startswith(_TMP):
                key = path.relative_to(self.root).as_posix()
                with path.open("rb") as handle:
                    yield self._read_header(key, handle)

    def delete(self, key: str) -> bool:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise ObjectError(
                f"object store {self.where}: deleting {key}: {exc.strerror}"
            ) from None
        return True
