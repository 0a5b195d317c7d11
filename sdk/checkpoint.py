"""Checkpoint integrity: `dx.save` writes a checksum sidecar `<path>.dxsum` beside each
checkpoint and a marker inside it; `dx.load` verifies the sidecar before torch.load and names
the first bad byte offset (the sidecar and the marker: checkpoint_sidecar.py).

It never lets training resume on a corrupt checkpoint without saying so (CheckpointCorrupt plus
ckpt.load_failure evidence): a file dx.save marked, or any file in HMAC mode (a site key in
$DENPEX_CKPT_KEY_FILE or key=), is refused without a sidecar that verifies; only an unmarked
(legacy) file loads with a warning. What torch.load reads is what torch.save wrote, plus the
zip comment. torch is imported lazily.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from typing import Any

import orjson

from denpex.core.detectors import detector_evidence
from denpex.core.events import Event
from denpex.sdk.checkpoint_sidecar import (
    CHUNK_BYTES,
    KEY_FILE_ENV,
    SIDECAR_SUFFIX,
    FileDigest,
    PathArg,
    Verdict,
    add_marker,
    authenticate,
    compare,
    digest_file,
    has_marker,
    seal,
    sidecar_path,
    site_key,
)
from denpex.sdk.transport import default_emit

__all__ = [
    "CHUNK_BYTES",
    "KEY_FILE_ENV",
    "SIDECAR_SUFFIX",
    "CheckpointCorrupt",
    "FileDigest",
    "Verdict",
    "check",
    "compare",
    "digest_file",
    "load",
    "protect_torch_checkpoints",
    "save",
    "sidecar_path",
    "unprotect_torch_checkpoints",
    "verify",
    "write_sidecar",
]


class CheckpointCorrupt(RuntimeError):
    """The checkpoint's bytes are not the ones `dx.save` wrote (or there is no sidecar that
    proves they are, where one is required). `offset` is the first byte known bad, None when
    unknown."""

    def __init__(self, path: str, reason: str, offset: int | None = None) -> None:
        where = f" (first bad byte at offset {offset})" if offset is not None else ""
        super().__init__(
            f"checkpoint {path} is corrupt: {reason}{where}; it was not loaded. Load an earlier "
            "checkpoint, or save this one again"
        )
        self.path = path
        self.reason = reason
        self.offset = offset


def write_sidecar(
    path: PathArg, chunk_bytes: int = CHUNK_BYTES, *, key: bytes | None = None
) -> str:
    """Digest `path` and write `<path>.dxsum` atomically (sealed with the site key, if any);
    returns the sidecar's path."""
    digest = digest_file(path, chunk_bytes)
    secret = site_key(key)
    target = sidecar_path(path)
    _write_atomic(target, _sidecar_bytes(seal(digest, secret) if secret else digest))
    return target


def verify(path: PathArg, *, key: bytes | None = None) -> Verdict:
    """Check `path` against `<path>.dxsum`; with a key, the sidecar's HMAC first (a missing
    checkpoint raises FileNotFoundError)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    marked = has_marker(path)
    try:
        with open(sidecar_path(path), "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return Verdict(True, False, "no checksum sidecar", marked=marked)
    try:
        expected = FileDigest.from_dict(orjson.loads(raw))
    except (orjson.JSONDecodeError, ValueError) as exc:
        return Verdict(False, True, f"checksum sidecar unreadable ({exc})", marked=marked)
    authentic = None
    if key is not None:
        problem = authenticate(expected, key)
        if problem:
            return Verdict(False, True, problem, marked=marked, authentic=False)
        authentic = True
    verdict = compare(expected, digest_file(path, expected.chunk_bytes))
    return Verdict(
        verdict.ok, True, verdict.reason, verdict.offset, marked=marked, authentic=authentic
    )


# --- save and load -----------------------------------------------------------------------------


def save(obj: Any, path: PathArg, *, key: bytes | None = None, **torch_save_kwargs: Any) -> None:
    """torch.save to a temp file, mark it, rename it into place, then write the sidecar
    (sealed with an HMAC when a site key is given or set in $DENPEX_CKPT_KEY_FILE).

    The old sidecar is removed first, so a crash in between leaves a marked checkpoint
    without a sidecar (refused: load the previous one), never one with a stale sidecar.
    A file-like `path` is saved as torch.save would, without a marker or sidecar."""
    torch = _torch()
    save_fn = _original.get("save", torch.save)
    if not isinstance(path, str | os.PathLike):
        save_fn(obj, path, **torch_save_kwargs)
        return
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        secret = site_key(key)
        save_fn(obj, tmp, **torch_save_kwargs)
        if not add_marker(tmp, "hmac-sha256" if secret else "xxh3"):  # fsyncs when it marks
            _fsync_path(tmp)
        digest = digest_file(tmp)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(sidecar_path(path))
        os.replace(tmp, path)
        _write_atomic(
            sidecar_path(path), _sidecar_bytes(seal(digest, secret) if secret else digest)
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


def load(
    path: PathArg,
    *,
    strict: bool | None = None,
    key: bytes | None = None,
    **torch_load_kwargs: Any,
) -> Any:
    """Verify `path` against its sidecar, then torch.load it.

    Corrupt or truncated: raises CheckpointCorrupt (and reports ckpt.load_failure with the first
    bad offset) before torch.load reads a byte. No sidecar: refused when the file carries
    dx.save's marker or a site key is set (HMAC mode: the sidecar's HMAC must verify too),
    else loaded with a warning; `strict` True or False overrides that choice for a missing
    sidecar. A file-like `path` is loaded unverified."""
    torch = _torch()
    load_fn = _original.get("load", torch.load)
    if isinstance(path, str | os.PathLike):
        check(path, strict=strict, key=key)
    return load_fn(path, **torch_load_kwargs)


def check(path: PathArg, *, strict: bool | None = None, key: bytes | None = None) -> Verdict:
    """verify() plus what load() does about the result: report, and raise when refused."""
    path = os.fspath(path)
    secret = site_key(key)
    verdict = verify(path, key=secret)
    if not verdict.ok:
        detector = (
            "ckpt.load_failure.sidecar_unauthenticated"
            if verdict.authentic is False
            else "ckpt.load_failure.checksum_mismatch"
        )
        _report(detector, path, verdict.offset, {"reason": verdict.reason})
        raise CheckpointCorrupt(path, verdict.reason, verdict.offset)
    if not verdict.sidecar_found:
        refuse = strict if strict is not None else verdict.marked or secret is not None
        severity = "error" if refuse else "warning"
        values = {"suffix": SIDECAR_SUFFIX}
        if verdict.marked:
            detector = "ckpt.load_failure.marked_without_sidecar"
            reason = f"dx.save marked it, but its {SIDECAR_SUFFIX} sidecar is missing"
        else:
            detector = "ckpt.load_failure.sidecar_missing"
            why = "HMAC mode" if strict is None else "strict mode"
            reason = f"no {SIDECAR_SUFFIX} sidecar ({why})"
        _report(detector, path, None, values, severity=severity)
        if refuse:
            raise CheckpointCorrupt(path, reason)
    return verdict


# --- torch.save / torch.load for code that calls them directly ----------------------------------

_original: dict[str, Any] = {}


def protect_torch_checkpoints(*, strict: bool | None = None, key: bytes | None = None) -> None:
    """Make torch.save write markers and sidecars and torch.load verify them, for code (and
    libraries, e.g. a trainer's own checkpointing) that call torch.save/torch.load directly:

        from denpex.sdk.checkpoint import protect_torch_checkpoints
        protect_torch_checkpoints()          # strict=True: refuse every file without a sidecar
        trainer.train()                      # every torch.save/torch.load to a path is checked

    strict and key as for load(). Only saves and loads by file path are covered (file
    objects pass through unchanged), and only calls through the `torch` module's attributes
    (not `from torch import save` made before). Idempotent; undo with
    unprotect_torch_checkpoints()."""
    torch = _torch()
    if _original:
        return
    _original["save"], _original["load"] = torch.save, torch.load

    def protected_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if args:  # positional torch.save options: pass through untouched
            _original["save"](obj, f, *args, **kwargs)
        else:
            save(obj, f, key=key, **kwargs)

    def protected_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(f, str | os.PathLike) and os.path.isfile(f):
            check(f, strict=strict, key=key)
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


def _sidecar_bytes(digest: FileDigest) -> bytes:
    return orjson.dumps(digest.to_dict(), option=orjson.OPT_INDENT_2)


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
