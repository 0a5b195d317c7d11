"""Checkpoint integrity: `dx.save` writes a checksum sidecar `<path>.dxsum` beside each
checkpoint; `dx.load` verifies it before torch.load and names the first bad byte offset.

It never lets training resume on a corrupt checkpoint without saying so (CheckpointCorrupt plus
ckpt.load_failure evidence), and never changes what torch.save writes. torch is imported lazily.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson

import denpex._native as native
from denpex.core.detectors import detector_evidence
from denpex.core.events import Event
from denpex.sdk.transport import default_emit

SIDECAR_SUFFIX = ".dxsum"
SIDECAR_VERSION = 1
CHUNK_BYTES = 8 << 20  # a corruption is located to one chunk of this size
PathArg = str | os.PathLike[str]


class CheckpointCorrupt(RuntimeError):
    """The checkpoint's bytes are not the ones `dx.save` wrote (or, in strict mode, there is no
    sidecar to prove they are). `offset` is the first byte known bad, None when unknown."""

    def __init__(self, path: str, reason: str, offset: int | None = None) -> None:
        where = f" (first bad byte at offset {offset})" if offset is not None else ""
        super().__init__(
            f"checkpoint {path} is corrupt: {reason}{where}; it was not loaded. Load an earlier "
            "checkpoint, or save this one again"
        )
        self.path = path
        self.reason = reason
        self.offset = offset


@dataclass(frozen=True, slots=True)
class FileDigest:
    """What a sidecar records about one file."""

    size: int
    xxh3_128: int
    chunk_bytes: int
    chunks: tuple[int, ...] = field(default=())  # XXH3-64 of each chunk, in file order

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": SIDECAR_VERSION,
            "algorithm": "xxh3",
            "size": self.size,
            "xxh3_128": f"{self.xxh3_128:032x}",
            "chunk_bytes": self.chunk_bytes,
            "chunks_xxh3_64": [f"{h:016x}" for h in self.chunks],
        }

    @classmethod
    def from_dict(cls, data: Any) -> FileDigest:
        if not isinstance(data, dict) or data.get("version") != SIDECAR_VERSION:
            version = data.get("version") if isinstance(data, dict) else None
            raise ValueError(f"sidecar version {version!r} is not {SIDECAR_VERSION}")
        try:
            return cls(
                size=int(data["size"]),
                xxh3_128=int(data["xxh3_128"], 16),
                chunk_bytes=int(data["chunk_bytes"]),
                chunks=tuple(int(h, 16) for h in data["chunks_xxh3_64"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"sidecar is malformed: {exc}") from None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of checking one checkpoint against its sidecar."""

    ok: bool
    sidecar_found: bool
    reason: str = ""
    offset: int | None = None  # first bad byte (corrupt only)


def sidecar_path(path: PathArg) -> str:
    return os.fspath(path) + SIDECAR_SUFFIX


@contextlib.contextmanager
def _mapped(path: str) -> Iterator[memoryview]:
    """The file's bytes, mapped read-only: the page cache streams them, nothing is copied."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            yield memoryview(b"")
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                yield view
            finally:
                view.release()


def digest_file(path: PathArg, chunk_bytes: int = CHUNK_BYTES) -> FileDigest:
    """Size, XXH3-128 of the whole file and XXH3-64 of each chunk (one mapping, GIL released)."""
    checksum = native.load("checksum")
    with _mapped(os.fspath(path)) as view:
        pieces = [view[at : at + chunk_bytes] for at in range(0, len(view), chunk_bytes)]
        try:
            whole = checksum.xxh3_128(view)
            chunks = tuple(checksum.xxh3_64_many(pieces)) if pieces else ()
        finally:
            for piece in pieces:
                piece.release()
        return FileDigest(len(view), whole, chunk_bytes, chunks)


def write_sidecar(path: PathArg, chunk_bytes: int = CHUNK_BYTES) -> str:
    """Digest `path` and write `<path>.dxsum` atomically; returns the sidecar's path."""
    digest = digest_file(path, chunk_bytes)
    target = sidecar_path(path)
    _write_atomic(target, orjson.dumps(digest.to_dict(), option=orjson.OPT_INDENT_2))
    return target


def compare(expected: FileDigest, actual: FileDigest) -> Verdict:
    """Pure: where `actual` departs from `expected` (same chunk size assumed)."""
    bad_chunk = next(
        (i for i, (a, b) in enumerate(zip(expected.chunks, actual.chunks, strict=False)) if a != b),
        None,
    )
    if actual.size != expected.size:
        offset = min(actual.size, expected.size)
        if bad_chunk is not None:
            offset = min(offset, bad_chunk * expected.chunk_bytes)
        kind = "truncated" if actual.size < expected.size else "longer than written"
        reason = f"{kind}: {actual.size} bytes, {expected.size} were written"
        return Verdict(False, True, reason, offset)
    if bad_chunk is not None:
        return Verdict(
            False, True, "content differs from what was written", bad_chunk * expected.chunk_bytes
        )
    if actual.xxh3_128 != expected.xxh3_128:
        return Verdict(False, True, "XXH3-128 of the file differs from what was written", None)
    return Verdict(True, True)


def verify(path: PathArg) -> Verdict:
    """Check `path` against `<path>.dxsum` (a missing checkpoint raises FileNotFoundError)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        with open(sidecar_path(path), "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return Verdict(True, False, "no checksum sidecar")
    try:
        expected = FileDigest.from_dict(orjson.loads(raw))
    except (orjson.JSONDecodeError, ValueError) as exc:
        return Verdict(False, True, f"checksum sidecar unreadable ({exc})")
    return compare(expected, digest_file(path, expected.chunk_bytes))


# --- save and load -----------------------------------------------------------------------------


def save(obj: Any, path: PathArg, **torch_save_kwargs: Any) -> None:
    """torch.save to a temp file, rename it into place, then write the sidecar.

    The old sidecar is removed first, so a crash in between leaves a checkpoint without a
    sidecar (loaded with a warning), never one with a stale sidecar (refused as corrupt).
    A file-like `path` is saved as torch.save would, without a sidecar."""
    torch = _torch()
    save_fn = _original.get("save", torch.save)
    if not isinstance(path, str | os.PathLike):
        save_fn(obj, path, **torch_save_kwargs)
        return
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        save_fn(obj, tmp, **torch_save_kwargs)
        _fsync_path(tmp)
        digest = digest_file(tmp)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sidecar_path(path))
        os.replace(tmp, path)
        _write_atomic(
            sidecar_path(path), orjson.dumps(digest.to_dict(), option=orjson.OPT_INDENT_2)
        )
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, Exception):
            _report(
                "ckpt.save_failure.sdk_save_error",
                path,
                None,
                {"error": f"{type(exc).__name__}: {exc}"},
            )
        raise


def load(path: PathArg, *, strict: bool = False, **torch_load_kwargs: Any) -> Any:
    """Verify `path` against its sidecar, then torch.load it.

    Corrupt or truncated: raises CheckpointCorrupt (and reports ckpt.load_failure with the first
    bad offset) before torch.load reads a byte. No sidecar: loads, reporting a warning, unless
    `strict` (then it refuses, as for a corrupt file). A file-like `path` is loaded unverified."""
    torch = _torch()
    load_fn = _original.get("load", torch.load)
    if isinstance(path, str | os.PathLike):
        check(path, strict=strict)
    return load_fn(path, **torch_load_kwargs)


def check(path: PathArg, *, strict: bool = False) -> Verdict:
    """verify() plus what load() does about the result: report, and raise when corrupt."""
    path = os.fspath(path)
    verdict = verify(path)
    if not verdict.ok:
        _report(
            "ckpt.load_failure.checksum_mismatch", path, verdict.offset, {"reason": verdict.reason}
        )
        raise CheckpointCorrupt(path, verdict.reason, verdict.offset)
    if not verdict.sidecar_found:
        _report(
            "ckpt.load_failure.sidecar_missing",
            path,
            None,
            {"suffix": SIDECAR_SUFFIX},
            severity="error" if strict else "warning",  # strict mode refuses the load
        )
        if strict:
            raise CheckpointCorrupt(path, f"no {SIDECAR_SUFFIX} sidecar (strict mode)")
    return verdict


# --- torch.save / torch.load for code that calls them directly ----------------------------------

_original: dict[str, Any] = {}


def protect_torch_checkpoints(*, strict: bool = False) -> None:
    """Make torch.save write sidecars and torch.load verify them, for code (and libraries,
    e.g. a trainer's own checkpointing) that call torch.save/torch.load directly:

        from denpex.sdk.checkpoint import protect_torch_checkpoints
        protect_torch_checkpoints()          # strict=True: refuse files without a sidecar
        trainer.train()                      # every torch.save/torch.load to a path is checked

    Only saves and loads by file path are covered (file objects pass through unchanged), and
    only calls through the `torch` module's attributes (not `from torch import save` made
    before). Idempotent; undo with unprotect_torch_checkpoints()."""
    torch = _torch()
    if _original:
        return
    _original["save"], _original["load"] = torch.save, torch.load

    def protected_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if args:  # positional torch.save options: pass through untouched
            _original["save"](obj, f, *args, **kwargs)
        else:
            save(obj, f, **kwargs)

    def protected_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, str | os.PathLike) and os.path.isfile(f):
            check(f, strict=strict)
        return _original["load"](f, *args, **kwargs)

    torch.save, torch.load = protected_save, protected_load


def unprotect_torch_checkpoints() -> None:
    """Put the original torch.save and torch.load back."""
    if not _original:
        return
    torch = _torch()
    torch.save, torch.load = _original.pop("save"), _original.pop("load")


# --- helpers ------------------------------------------------------------------------------------


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("denpex.sdk checkpoints need PyTorch: pip install torch") from exc
    return torch


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def _report(
    detector_id: str,
    path: str,
    offset: int | None,
    values: dict[str, Any],
    *,
    severity: str | None = None,
) -> None:
    captures = {"file": path}
    if offset is not None:
        captures["offset"] = str(offset)
    rank = os.environ.get("RANK", "")
    if rank.isdigit():
        captures["rank"] = rank
    event = Event(
        body="",
        ts_ns=time.time_ns(),
        source="sdk",
        kind="state",
        rank=int(rank) if rank.isdigit() else None,
        attrs={"file": path, **({"offset": offset} if offset is not None else {})},
    )
    evidence = detector_evidence(
        event, detector_id, captures=captures, values=values, severity=severity
    )
    evidence.id = f"sdk-{uuid.uuid4().hex[:16]}"
    event.body = evidence.summary
    default_emit(evidence)
