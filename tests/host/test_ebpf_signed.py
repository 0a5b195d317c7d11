"""Signed eBPF objects: a `.bpf.o` loads only when its `.minisig` verifies with the release
key in force (the collector's `release_key`, else the key shipped beside the objects); a
tampered object, a missing signature or another key's signature is refused before libbpf
sees it, and the other programs still run. With real BPF (root, BTF): the kernel is handed
the verified objects and never the tampered one."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from denpex.core import signing
from denpex.core.roots import Roots
from denpex.host.ebpf import signed
from denpex.host.ebpf.collector import EbpfCollector
from tests.host.ebpf_support import bpf_unavailable, built_dir

WHY_NOT = bpf_unavailable()
OBJECT = b"\x7fELF" + bytes(range(256)) * 8  # any bytes: the signature covers them all


def sign_into(folder: Path, key: signing.SecretKey, *names: str) -> None:
    for name in names:
        path = folder / name
        text = signing.sign(path.read_bytes(), key, f"file:{name}")
        path.with_name(name + signed.SIGNATURE_SUFFIX).write_text(text)


def write_key(path: Path, key: signing.SecretKey) -> Path:
    path.write_text(signing.format_public_key(key.public_key()))
    return path


@pytest.fixture
def release(tmp_path: Path) -> tuple[Path, signing.SecretKey]:
    key = signing.generate_keypair()
    folder = tmp_path / "objects"
    folder.mkdir()
    (folder / "sched.bpf.o").write_bytes(OBJECT)
    sign_into(folder, key, "sched.bpf.o")
    return folder, key


def test_a_signed_object_verifies_with_the_shipped_key(release):
    folder, key = release
    write_key(folder / signed.SHIPPED_KEY, key)
    trust = signed.trust_for(folder, None)
    assert trust.key == key.public_key() and "signed by release key" in trust.describe
    assert signed.verified_bytes(folder / "sched.bpf.o", trust) == OBJECT


def test_one_flipped_byte_is_refused(release):
    folder, key = release
    tampered = bytearray(OBJECT)
    tampered[100] ^= 0x01
    (folder / "sched.bpf.o").write_bytes(bytes(tampered))
    trust = signed.trust_for(folder, str(write_key(folder / "trusted.pub", key)))
    with pytest.raises(signed.UnsignedObject, match="signature does not verify"):
        signed.verified_bytes(folder / "sched.bpf.o", trust)


def test_a_missing_signature_or_another_key_is_refused(release, tmp_path):
    folder, key = release
    other = signing.generate_keypair()
    trust = signed.trust_for(folder, str(write_key(tmp_path / "other.pub", other)))
    with pytest.raises(signed.UnsignedObject, match="not with the trusted key"):
        signed.verified_bytes(folder / "sched.bpf.o", trust)
    (folder / "sched.bpf.o.minisig").unlink()
    trust = signed.trust_for(folder, str(write_key(tmp_path / "key.pub", key)))
    with pytest.raises(signed.UnsignedObject, match="no signature"):
        signed.verified_bytes(folder / "sched.bpf.o", trust)


def test_a_configured_key_is_never_dropped(release, tmp_path):
    folder, _ = release
    with pytest.raises(signed.UnsignedObject, match="release key"):
        signed.trust_for(folder, str(tmp_path / "absent.pub"))
    (tmp_path / "bad.pub").write_text("not a key\n")
    with pytest.raises(signed.UnsignedObject, match="release key"):
        signed.trust_for(folder, str(tmp_path / "bad.pub"))
    collector = EbpfCollector(Roots(), {"bpf_dir": str(folder), "release_key": "/absent.pub"})
    collector.load()
    assert "release key /absent.pub" in collector.program_errors["sched"]
    assert collector.objects == {}


def test_a_source_build_without_any_key_loads_unsigned_and_says_so(release):
    folder, _ = release
    trust = signed.trust_for(folder, None)
    assert trust.key is None and "unsigned" in trust.describe
    assert signed.verified_bytes(folder / "sched.bpf.o", trust) == OBJECT


@pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")
def test_the_agent_refuses_a_tampered_object_and_loads_the_signed_ones(tmp_path):
    built = built_dir(tmp_path / "build")
    folder = tmp_path / "release"
    folder.mkdir()
    for name in ("sched.bpf.o", "oom.bpf.o", "pagefault.bpf.o", "layouts.json"):
        shutil.copy(built / name, folder / name)
    key = signing.generate_keypair()
    sign_into(folder, key, "sched.bpf.o", "oom.bpf.o", "pagefault.bpf.o")
    write_key(folder / signed.SHIPPED_KEY, key)
    # tamper after signing: one byte of the object's string table (still a loadable ELF)
    data = bytearray((folder / "oom.bpf.o").read_bytes())
    at = data.rindex(b"GPL")
    data[at] = ord("g")
    (folder / "oom.bpf.o").write_bytes(bytes(data))

    collector = EbpfCollector(
        Roots(), {"bpf_dir": str(folder), "programs": ["sched", "oom", "pagefault"]}
    )
    ok, why = collector.available()
    assert ok and f"signed by release key {key.public_key().key_id_hex}" in why, why
    try:
        collector.load()
        assert set(collector.objects) == {"sched", "pagefault"}
        assert "signature does not verify" in collector.program_errors["oom"]
    finally:
        collector.close()
