"""Checkpoints that prove themselves: the marker dx.save leaves inside the file makes a lost
sidecar a refusal, and in HMAC mode (a site key) a sidecar rewritten without the key is
refused too. Random byte flips use a fixed, printed seed."""

from __future__ import annotations

import os
import random
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from denpex.sdk import checkpoint as ckpt
from denpex.sdk import checkpoint_sidecar as sidecar
from tests.sdk.test_checkpoint import no_wrapper_socket, reported, state

torch = pytest.importorskip("torch", reason="checkpoints are written with torch.save")

# the digests go through the compiled checksum module and its pure-Python twin
pytestmark = pytest.mark.usefixtures("both_backends")

__all__ = ["no_wrapper_socket"]  # the autouse fixture: no wrapper socket, stderr evidence

KEY = b"site-key-0123456789abcdef-0123456789"
FLIPS = 100


@pytest.fixture(autouse=True)
def no_site_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(sidecar.KEY_FILE_ENV, raising=False)


@pytest.fixture(autouse=True)
def evidence_drained(capfd: pytest.CaptureFixture[str]) -> Iterator[None]:
    yield
    reported(capfd)  # what a test did not read must not spill into the next one


@pytest.fixture
def key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "site.key"
    path.write_bytes(KEY + b"\n")
    monkeypatch.setenv(sidecar.KEY_FILE_ENV, str(path))
    return path


def flipped(data: bytes, rng: random.Random) -> tuple[bytes, int]:
    at = rng.randrange(len(data))
    damaged = bytearray(data)
    damaged[at] ^= rng.randrange(1, 256)
    return bytes(damaged), at


def refused(path: Path, **kw: object) -> ckpt.CheckpointCorrupt | None:
    try:
        ckpt.check(path, **kw)  # type: ignore[arg-type]
    except ckpt.CheckpointCorrupt as exc:
        return exc
    return None


# ---------------------------------------------------------------------------- the marker
def test_save_marks_the_file_and_torch_still_loads_it(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    ckpt.save(state(), path)
    with zipfile.ZipFile(path) as archive:
        assert archive.comment == sidecar.marker_comment("xxh3")
        assert archive.testzip() is None
    for kwargs in ({"weights_only": True}, {"weights_only": True, "mmap": True}):
        assert torch.equal(torch.load(path, **kwargs)["w"], state()["w"])
    copy = tmp_path / "copied.pt"
    shutil.copyfile(path, copy)  # a copy without its sidecar is still known as marked
    assert sidecar.has_marker(str(copy)) and not Path(ckpt.sidecar_path(copy)).exists()
    assert ckpt.verify(path).marked and ckpt.verify(path).ok


def test_a_marked_checkpoint_without_its_sidecar_is_refused(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.pt"
    ckpt.save(state(1000), path)
    os.unlink(ckpt.sidecar_path(path))
    capfd.readouterr()
    with pytest.raises(ckpt.CheckpointCorrupt, match=r"dx.save marked it.*\.dxsum.*missing"):
        ckpt.load(path, weights_only=True)
    (found,) = reported(capfd)
    assert found.signature == "ckpt.load_failure.marked_without_sidecar"
    assert found.severity == "error" and found.category == "ckpt.load_failure"
    assert ckpt.load(path, strict=False, weights_only=True)["step"] == 7  # asked for: warned
    (warned,) = reported(capfd)
    assert warned.signature == found.signature and warned.severity == "warning"


def test_random_byte_flips_of_a_marked_checkpoint_without_sidecar_are_refused(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    seed = 20261
    print("seed", seed)
    rng = random.Random(seed)
    pristine = tmp_path / "model.pt"
    ckpt.save(state(50_000), pristine)
    data = pristine.read_bytes()
    target = tmp_path / "flipped.pt"
    escaped = []
    for _ in range(FLIPS):
        damaged, at = flipped(data, rng)
        target.write_bytes(damaged)
        if refused(target) is None:
            escaped.append(at)
    assert escaped == [], f"flips at these offsets loaded: {escaped}"
    found = reported(capfd)
    assert len(found) == FLIPS
    assert {(e.signature, e.severity) for e in found} == {
        ("ckpt.load_failure.marked_without_sidecar", "error")
    }


def test_no_single_damaged_byte_of_the_marker_unmarks_the_file(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.pt"
    ckpt.save(state(1000), path)
    os.unlink(ckpt.sidecar_path(path))
    data = path.read_bytes()
    tail = len(sidecar.marker_comment("xxh3")) + 22  # the end record and the comment
    for at in range(len(data) - tail, len(data)):
        for xor in (0x01, 0xFF):
            damaged = bytearray(data)
            damaged[at] ^= xor
            path.write_bytes(bytes(damaged))
            assert refused(path) is not None, f"byte {at} ^ {xor:#x} unmarked the file"
    assert {e.severity for e in reported(capfd)} == {"error"}


def test_legacy_checkpoints_still_load_with_a_warning(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "legacy.pt"
    torch.save(state(1000), path)  # no marker, no sidecar
    capfd.readouterr()
    assert not ckpt.verify(path).marked
    assert ckpt.load(path, weights_only=True)["step"] == 7
    (warning,) = reported(capfd)
    assert warning.signature == "ckpt.load_failure.sidecar_missing"
    assert warning.severity == "warning"


def test_the_old_torch_format_is_saved_unmarked_and_verified(tmp_path: Path) -> None:
    path = tmp_path / "old.pt"
    ckpt.save(state(1000), path, _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(path) and not ckpt.verify(path).marked
    assert ckpt.verify(path).ok and ckpt.load(path, weights_only=True)["step"] == 7


# ---------------------------------------------------------------------------- HMAC mode
def test_hmac_mode_seals_the_sidecar_and_loads(tmp_path: Path, key_file: Path) -> None:
    path = tmp_path / "model.pt"
    ckpt.save(state(1000), path)
    doc = orjson.loads(Path(ckpt.sidecar_path(path)).read_bytes())
    assert len(doc["hmac_sha256"]) == 64 and doc["key_id"] == sidecar.key_id(KEY)
    assert KEY.decode() not in Path(ckpt.sidecar_path(path)).read_text()
    with zipfile.ZipFile(path) as archive:
        assert archive.comment == sidecar.marker_comment("hmac-sha256")
    assert ckpt.verify(path, key=KEY).authentic is True
    assert ckpt.load(path, weights_only=True)["step"] == 7
    os.environ.pop(sidecar.KEY_FILE_ENV)
    assert ckpt.load(path, key=KEY, weights_only=True)["step"] == 7  # key= works alike


def test_flips_with_a_forged_sidecar_are_refused_in_hmac_mode(
    tmp_path: Path, key_file: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    seed = 4242
    print("seed", seed)
    rng = random.Random(seed)
    path = tmp_path / "model.pt"
    ckpt.save(state(50_000), path)
    data = path.read_bytes()
    sealed = orjson.loads(Path(ckpt.sidecar_path(path)).read_bytes())
    escaped = []
    for trial in range(FLIPS):
        damaged, at = flipped(data, rng)
        path.write_bytes(damaged)
        forged = ckpt.digest_file(path).to_dict()  # recomputed by someone without the key
        if trial % 2:  # ... who also kept the old HMAC and key id
            forged |= {"hmac_sha256": sealed["hmac_sha256"], "key_id": sealed["key_id"]}
        Path(ckpt.sidecar_path(path)).write_bytes(orjson.dumps(forged))
        if (exc := refused(path)) is None:
            escaped.append(at)
        else:
            assert "HMAC" in exc.reason or "sealed" in exc.reason
    assert escaped == [], f"forged sidecars accepted after flips at {escaped}"
    kinds = {found.signature for found in reported(capfd)}
    assert kinds == {"ckpt.load_failure.sidecar_unauthenticated"}


def test_a_sidecar_sealed_with_another_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    ckpt.save(state(1000), path, key=KEY)
    exc = refused(path, key=b"another-site-key-0123456789")
    assert exc is not None and "another key" in exc.reason
    assert refused(path, key=KEY) is None


def test_hmac_mode_refuses_files_stripped_of_marker_and_sidecar(
    tmp_path: Path, key_file: Path
) -> None:
    path = tmp_path / "model.pt"
    torch.save(state(1000), path)  # as if rewritten: no marker, no sidecar
    exc = refused(path)
    assert exc is not None and "HMAC mode" in exc.reason
    assert refused(path, strict=False) is None  # only when asked for


def test_a_bad_site_key_is_refused_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        sidecar.site_key(b"short")
    monkeypatch.setenv(sidecar.KEY_FILE_ENV, str(tmp_path / "missing.key"))
    with pytest.raises(ValueError, match=r"DENPEX_CKPT_KEY_FILE=.*missing.key cannot be read"):
        ckpt.save(state(10), tmp_path / "x.pt")
    assert not list(tmp_path.iterdir())  # nothing written


def test_protect_torch_checkpoints_in_hmac_mode(tmp_path: Path) -> None:
    path = tmp_path / "wrapped.pt"
    ckpt.protect_torch_checkpoints(key=KEY)
    try:
        torch.save(state(1000), path)
        assert torch.load(path, weights_only=True)["step"] == 7
        ckpt.write_sidecar(path)  # rewritten without the key
        with pytest.raises(ckpt.CheckpointCorrupt, match="no HMAC"):
            torch.load(path)
    finally:
        ckpt.unprotect_torch_checkpoints()
