"""minisign-compatible Ed25519 signatures: round trips, tampering, wrong keys, malformed files,
and, where `minisign` is installed, both directions of a cross-check with the real tool."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest

from denpex.core import signing

DATA = b"0123abcd  denpex/denpex\n" * 10


@pytest.fixture(scope="module")
def key() -> signing.SecretKey:
    return signing.generate_keypair()


@pytest.mark.parametrize("prehashed", [True, False])
def test_round_trip(key, prehashed):
    text = signing.sign(DATA, key, "timestamp:1 file:SHA256SUMS", prehashed=prehashed)
    sig = signing.verify(DATA, text, key.public_key())
    assert sig.trusted_comment == "timestamp:1 file:SHA256SUMS"
    assert sig.algorithm == (b"ED" if prehashed else b"Ed")
    assert text.splitlines()[0].startswith("untrusted comment: ")


def test_key_files_round_trip(key):
    public = signing.parse_public_key(signing.format_public_key(key.public_key()))
    assert public == key.public_key()
    assert signing.parse_secret_key(signing.format_secret_key(key)) == key
    # the base64 line alone is also accepted (as minisign's -P)
    line = signing.format_public_key(key.public_key()).splitlines()[1]
    assert signing.parse_public_key(line) == public


def test_key_id_printed_like_minisign():
    assert signing.key_id_hex(bytes.fromhex("3660569ac12f9843")) == "43982FC19A566036"


def test_tampered_data_rejected(key):
    text = signing.sign(DATA, key, "c")
    flipped = bytearray(DATA)
    flipped[5] ^= 1
    with pytest.raises(signing.SignatureError, match="does not match the data"):
        signing.verify(bytes(flipped), text, key.public_key())


def test_tampered_trusted_comment_rejected(key):
    lines = signing.sign(DATA, key, "version 1.0").splitlines()
    lines[2] = "trusted comment: version 9.9"
    with pytest.raises(signing.SignatureError, match="trusted comment was altered"):
        signing.verify(DATA, "\n".join(lines), key.public_key())


def test_wrong_key_rejected(key):
    other = signing.generate_keypair()
    text = signing.sign(DATA, other, "c")
    with pytest.raises(signing.SignatureError, match="not with the trusted key"):
        signing.verify(DATA, text, key.public_key())
    # same key id, different key: the signature itself fails
    impostor = signing.PublicKey(key.key_id, other.public)
    with pytest.raises(signing.SignatureError, match="does not match"):
        signing.verify(DATA, signing.sign(DATA, key, "c"), impostor)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "expected 4 lines"),
        ("untrusted comment: x\nAAAA\ntrusted comment: y\n", "expected 4 lines"),
        (
            "comment: x\n" + _b64(b"ED" + bytes(72)) + "\ntrusted comment: y\n" + _b64(bytes(64)),
            "untrusted comment",
        ),
        ("untrusted comment: x\n!!!\ntrusted comment: y\n" + _b64(bytes(64)), "invalid base64"),
        (
            "untrusted comment: x\n"
            + _b64(b"ED" + bytes(71))
            + "\ntrusted comment: y\n"
            + _b64(bytes(64)),
            "73 bytes",
        ),
        (
            "untrusted comment: x\n"
            + _b64(b"XX" + bytes(72))
            + "\ntrusted comment: y\n"
            + _b64(bytes(64)),
            "unknown algorithm",
        ),
        (
            "untrusted comment: x\n" + _b64(b"ED" + bytes(72)) + "\ncomment: y\n" + _b64(bytes(64)),
            "trusted comment",
        ),
        (
            "untrusted comment: x\n"
            + _b64(b"ED" + bytes(72))
            + "\ntrusted comment: y\n"
            + _b64(bytes(63)),
            "63 bytes",
        ),
    ],
)
def test_malformed_signatures(text, message):
    with pytest.raises(signing.SignatureError, match=message):
        signing.parse_signature(text)


@pytest.mark.parametrize(
    "text, message",
    [
        ("untrusted comment: k\n" + _b64(b"Ed" + bytes(39)), "41 bytes"),
        ("untrusted comment: k\n" + _b64(b"RS" + bytes(40)), "not Ed25519"),
        ("untrusted comment: k\nnot-base64!\n", "invalid base64"),
        ("a\nb\nc\n", "expected 2 lines"),
        (b"\xff\xfe\n\xff\n", "not UTF-8|invalid base64"),
    ],
)
def test_malformed_public_keys(text, message):
    with pytest.raises(signing.SignatureError, match=message):
        signing.parse_public_key(text)


def test_secret_key_checks(key):
    raw = bytearray(base64.b64decode(signing.format_secret_key(key).splitlines()[1]))
    damaged = bytearray(raw)
    damaged[70] ^= 1  # inside the secret key, covered by the checksum
    with pytest.raises(signing.SignatureError, match="checksum"):
        signing.parse_secret_key(f"untrusted comment: k\n{_b64(bytes(damaged))}\n")
    encrypted = bytearray(raw)
    encrypted[2:4] = b"Sc"
    with pytest.raises(signing.SignatureError, match="encrypted with a password"):
        signing.parse_secret_key(f"untrusted comment: k\n{_b64(bytes(encrypted))}\n")


def test_comments_must_be_one_line(key):
    with pytest.raises(signing.SignatureError, match="one line"):
        signing.sign(DATA, key, "two\nlines")


MINISIGN = shutil.which("minisign")
needs_minisign = pytest.mark.skipif(
    MINISIGN is None, reason="minisign is not installed (apt-get install minisign)"
)


@needs_minisign
def test_minisign_accepts_our_signatures(tmp_path: Path, key):
    (tmp_path / "k.pub").write_text(signing.format_public_key(key.public_key()))
    (tmp_path / "data").write_bytes(DATA)
    for prehashed in (True, False):
        (tmp_path / "data.minisig").write_text(
            signing.sign(DATA, key, "from denpex", prehashed=prehashed)
        )
        proc = subprocess.run(
            [MINISIGN, "-V", "-p", "k.pub", "-m", "data"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 0, proc.stderr
        assert "from denpex" in proc.stdout
    # and it refuses one we tampered with
    (tmp_path / "data").write_bytes(DATA + b"x")
    proc = subprocess.run(
        [MINISIGN, "-V", "-p", "k.pub", "-m", "data"], cwd=tmp_path, capture_output=True
    )
    assert proc.returncode != 0


@needs_minisign
def test_we_accept_minisign_keys_and_signatures(tmp_path: Path):
    subprocess.run(
        [MINISIGN, "-G", "-W", "-p", "m.pub", "-s", "m.key"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    (tmp_path / "data").write_bytes(DATA)
    subprocess.run(
        [MINISIGN, "-S", "-s", "m.key", "-m", "data", "-t", "signed by minisign"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    public = signing.parse_public_key((tmp_path / "m.pub").read_text())
    # minisign prints the id as a number: without leading zeros on some versions
    printed = (tmp_path / "m.pub").read_text().splitlines()[0].split()[-1]
    assert int(printed, 16) == int(public.key_id_hex, 16)
    sig = signing.verify(DATA, (tmp_path / "data.minisig").read_text(), public)
    assert sig.trusted_comment == "signed by minisign"
    # minisign's unencrypted secret key signs here, and minisign verifies the result
    secret = signing.parse_secret_key((tmp_path / "m.key").read_text())
    assert secret.public_key() == public
    (tmp_path / "data.minisig").write_text(signing.sign(DATA, secret, "re-signed by denpex"))
    proc = subprocess.run(
        [MINISIGN, "-V", "-p", "m.pub", "-m", "data"], cwd=tmp_path, capture_output=True
    )
    assert proc.returncode == 0
    # a key of ours signs with minisign itself
    ours = signing.generate_keypair()
    (tmp_path / "o.key").write_text(signing.format_secret_key(ours))
    subprocess.run(
        [MINISIGN, "-S", "-s", "o.key", "-m", "data", "-x", "o.minisig", "-t", "t"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
    )
    signing.verify(DATA, (tmp_path / "o.minisig").read_text(), ours.public_key())
