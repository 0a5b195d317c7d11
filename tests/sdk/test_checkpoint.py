"""Checkpoint integrity: sidecar digests equal the xxhash package's, corruption and truncation
are refused before torch.load with the first bad offset, and reported as ckpt.load_failure."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from denpex.core.sdk_wire import decode_message, stderr_payload
from denpex.sdk import checkpoint as ckpt
from denpex.sdk.transport import default_transport

torch = pytest.importorskip("torch", reason="checkpoints are written with torch.save")
xxhash = pytest.importorskip("xxhash", reason="the xxhash package is the oracle")

# the digests go through the compiled checksum module and its pure-Python twin
pytestmark = pytest.mark.usefixtures("both_backends")


def reported(capfd: pytest.CaptureFixture[str]) -> list:
    """Evidence the SDK wrote to stderr (no wrapper socket in tests: the stderr fallback)."""
    default_transport().flush(2.0)
    err = capfd.readouterr().err.encode()
    return [decode_message(p) for line in err.splitlines() if (p := stderr_payload(line))]


@pytest.fixture(autouse=True)
def no_wrapper_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    if default_transport().mode != "stderr":
        pytest.skip("run without DENPEX_SDK_SOCKET: these tests read the stderr fallback")


def state(n: int = 300_000) -> dict:
    torch.manual_seed(0)
    return {"w": torch.randn(n), "step": 7}


def test_digest_matches_the_xxhash_package(tmp_path: Path) -> None:
    data = os.urandom(5 * 4096 + 123)
    path = tmp_path / "blob"
    path.write_bytes(data)
    digest = ckpt.digest_file(path, chunk_bytes=4096)
    assert digest.size == len(data)
    assert digest.xxh3_128 == xxhash.xxh3_128_intdigest(data)
    expected = [xxhash.xxh3_64_intdigest(data[at : at + 4096]) for at in range(0, len(data), 4096)]
    assert list(digest.chunks) == expected
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert ckpt.digest_file(empty).xxh3_128 == xxhash.xxh3_128_intdigest(b"")


def test_save_writes_a_versioned_sidecar_and_load_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    ckpt.save(state(), path)
    sidecar = orjson.loads((tmp_path / "model.pt.dxsum").read_bytes())
    assert sidecar["version"] == 1 and sidecar["size"] == path.stat().st_size
    assert sidecar["chunk_bytes"] == ckpt.CHUNK_BYTES
    assert int(sidecar["xxh3_128"], 16) == xxhash.xxh3_128_intdigest(path.read_bytes())
    assert [p.name for p in tmp_path.iterdir()] and not list(tmp_path.glob("*.tmp*"))
    loaded = ckpt.load(path, weights_only=True)
    assert torch.equal(loaded["w"], state()["w"]) and loaded["step"] == 7


def test_a_flipped_byte_is_refused_and_located(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.pt"
    ckpt.save(state(), path)
    size = path.stat().st_size
    with open(path, "r+b") as handle:  # flip one bit in the middle of the tensor data
        handle.seek(size // 2)
        byte = handle.read(1)
        handle.seek(size // 2)
        handle.write(bytes([byte[0] ^ 0x10]))
    capfd.readouterr()
    with pytest.raises(ckpt.CheckpointCorrupt, match=r"corrupt.*offset 0.*not loaded") as err:
        ckpt.load(path, weights_only=True)
    assert err.value.offset == 0  # the one 8 MiB chunk that holds the bad byte starts at 0
    verdict = ckpt.compare(
        ckpt.FileDigest.from_dict(orjson.loads((tmp_path / "model.pt.dxsum").read_bytes())),
        ckpt.digest_file(path),
    )
    assert not verdict.ok and verdict.offset == 0
    (found,) = reported(capfd)
    assert found.category == "ckpt.load_failure" and found.severity == "error"
    assert found.captures["file"] == str(path) and found.captures["offset"] == "0"
    assert found.event.source == "sdk" and found.event.kind == "state"


def test_corruption_offset_is_the_bad_chunk(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    data = bytearray(os.urandom(10 * 1024))
    path.write_bytes(data)
    expected = ckpt.digest_file(path, chunk_bytes=1024)
    data[7 * 1024 + 5] ^= 1
    path.write_bytes(data)
    verdict = ckpt.compare(expected, ckpt.digest_file(path, chunk_bytes=1024))
    assert not verdict.ok and verdict.offset == 7 * 1024


def test_a_truncated_checkpoint_is_refused(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.pt"
    ckpt.save(state(), path)
    size = path.stat().st_size
    os.truncate(path, size - 1000)
    capfd.readouterr()
    with pytest.raises(ckpt.CheckpointCorrupt, match="truncated") as err:
        ckpt.load(path)
    assert err.value.offset is not None and err.value.offset <= size - 1000
    (found,) = reported(capfd)
    assert "truncated" in found.summary


def test_missing_sidecar_loads_with_a_warning_unless_strict(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plain.pt"
    torch.save(state(1000), path)
    capfd.readouterr()
    assert ckpt.load(path, weights_only=True)["step"] == 7
    (warning,) = reported(capfd)
    assert warning.severity == "warning" and warning.category == "ckpt.load_failure"
    with pytest.raises(ckpt.CheckpointCorrupt, match="strict"):
        ckpt.load(path, strict=True)
    (refused,) = reported(capfd)
    assert refused.severity == "error"


def test_protect_torch_checkpoints_wraps_and_restores(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    original_save, original_load = torch.save, torch.load
    path = tmp_path / "wrapped.pt"
    ckpt.protect_torch_checkpoints()
    try:
        torch.save(state(1000), path)
        assert (tmp_path / "wrapped.pt.dxsum").exists()
        assert torch.load(path, weights_only=True)["step"] == 7
        with open(path, "r+b") as handle:
            handle.seek(100)
            handle.write(b"\xff\xff")
        with pytest.raises(ckpt.CheckpointCorrupt):
            torch.load(path)
    finally:
        ckpt.unprotect_torch_checkpoints()
    assert torch.save is original_save and torch.load is original_load
    torch.save({"x": 1}, tmp_path / "after.pt")
    assert not (tmp_path / "after.pt.dxsum").exists()
    assert [item.category for item in reported(capfd)] == ["ckpt.load_failure"]


def test_file_like_targets_pass_through(tmp_path: Path) -> None:
    import io

    buffer = io.BytesIO()
    ckpt.save({"a": 1}, buffer)
    buffer.seek(0)
    assert ckpt.load(buffer, weights_only=True) == {"a": 1}
