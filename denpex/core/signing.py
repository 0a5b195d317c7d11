"""Ed25519 signatures in minisign's file formats: parse, write, sign and verify.

Pure: bytes and text in, values out; it never reads a file or a clock. `cryptography` is
imported lazily, only by the functions that sign or verify.

Formats (https://jedisct1.github.io/minisign/):
  public key  "untrusted comment: ..." / base64("Ed" + key id (8) + public key (32))
  secret key  "untrusted comment: ..." / base64("Ed" + kdf (2) + "B2" + salt (32) + opslimit (8)
              + memlimit (8) + key id (8) + secret key (64) + BLAKE2b-256 checksum (32));
              only unencrypted keys (kdf = 0, `minisign -G -W`) are read here
  signature   "untrusted comment: ..." / base64("ED" + key id (8) + Ed25519(BLAKE2b-512(data)))
              "trusted comment: ..." / base64(Ed25519(signature (64) + trusted comment))
              ("Ed" instead of "ED": the legacy form, Ed25519 over the data itself)
The key id is 8 bytes; minisign prints it as a little-endian 64-bit number in hex.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from dataclasses import dataclass

ALG_LEGACY = b"Ed"
ALG_PREHASHED = b"ED"
KDF_NONE = b"\x00\x00"
KDF_SCRYPT = b"Sc"
CHECKSUM_ALG = b"B2"
UNTRUSTED = "untrusted comment: "
TRUSTED = "trusted comment: "


class SignatureError(Exception):
    """A key or signature that cannot be parsed, or a signature that does not verify."""


@dataclass(frozen=True)
class PublicKey:
    key_id: bytes  # 8 bytes, as stored
    key: bytes  # 32 bytes

    @property
    def key_id_hex(self) -> str:
        return key_id_hex(self.key_id)


@dataclass(frozen=True)
class SecretKey:
    key_id: bytes
    seed: bytes  # the 32-byte Ed25519 seed
    public: bytes  # the 32-byte public key

    def public_key(self) -> PublicKey:
        return PublicKey(self.key_id, self.public)


@dataclass(frozen=True)
class Signature:
    algorithm: bytes  # ALG_PREHASHED or ALG_LEGACY
    key_id: bytes
    signature: bytes  # 64 bytes over the data (or its BLAKE2b-512 hash)
    trusted_comment: str
    global_signature: bytes  # 64 bytes over signature + trusted comment
    untrusted_comment: str = ""


def key_id_hex(key_id: bytes) -> str:
    """The key id as minisign prints it (a little-endian 64-bit number, upper-case hex)."""
    return key_id[::-1].hex().upper()


def _lines(text: str | bytes, what: str, count: int) -> list[str]:
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise SignatureError(f"{what}: not UTF-8 text") from None
    lines = [line.rstrip("\r") for line in text.split("\n")]
    while lines and lines[-1] == "":
        lines.pop()
    if len(lines) != count:
        raise SignatureError(f"{what}: expected {count} lines, found {len(lines)}")
    return lines


def _b64(line: str, what: str, size: int) -> bytes:
    try:
        raw = base64.b64decode(line.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise SignatureError(f"{what}: invalid base64") from None
    if len(raw) != size:
        raise SignatureError(f"{what}: {len(raw)} bytes, expected {size}")
    return raw


def _comment(line: str, prefix: str, what: str) -> str:
    if not line.startswith(prefix):
        raise SignatureError(f"{what}: line does not start with {prefix.strip()!r}")
    return line[len(prefix) :]


def parse_public_key(text: str | bytes) -> PublicKey:
    """A minisign public key file (two lines), or its second line alone."""
    raw_text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    stripped = [line for line in raw_text.splitlines() if line.strip()]
    if len(stripped) == 1:
        line = stripped[0]
    else:
        lines = _lines(text, "public key", 2)
        _comment(lines[0], UNTRUSTED, "public key")
        line = lines[1]
    raw = _b64(line, "public key", 42)
    if raw[:2] != ALG_LEGACY:
        raise SignatureError(f"public key: algorithm {raw[:2]!r} is not Ed25519 ('Ed')")
    return PublicKey(raw[2:10], raw[10:])


def format_public_key(key: PublicKey, comment: str | None = None) -> str:
    comment = comment or f"minisign public key {key.key_id_hex}"
    body = base64.b64encode(ALG_LEGACY + key.key_id + key.key).decode()
    return f"{UNTRUSTED}{comment}\n{body}\n"


def _secret_checksum(key_id: bytes, secret: bytes) -> bytes:
    return hashlib.blake2b(ALG_LEGACY + key_id + secret, digest_size=32).digest()


def parse_secret_key(text: str | bytes) -> SecretKey:
    """An unencrypted minisign secret key file (`minisign -G -W`, or `generate_keypair`)."""
    lines = _lines(text, "secret key", 2)
    _comment(lines[0], UNTRUSTED, "secret key")
    raw = _b64(lines[1], "secret key", 158)
    if raw[:2] != ALG_LEGACY or raw[4:6] != CHECKSUM_ALG:
        raise SignatureError("secret key: not a minisign Ed25519 secret key")
    if raw[2:4] == KDF_SCRYPT:
        raise SignatureError(
            "secret key: encrypted with a password; this signer reads unencrypted keys only "
            "(make the release key with `minisign -G -W` and keep it offline)"
        )
    if raw[2:4] != KDF_NONE:
        raise SignatureError(f"secret key: unknown key derivation {raw[2:4]!r}")
    keynum = raw[54:]
    key_id, secret, checksum = keynum[:8], keynum[8:72], keynum[72:]
    # `minisign -G -W` (0.11) leaves the checksum of an unencrypted key all zero
    if checksum != bytes(32) and _secret_checksum(key_id, secret) != checksum:
        raise SignatureError("secret key: checksum mismatch (damaged file)")
    seed, public = secret[:32], secret[32:]
    if _public_from_seed(seed) != public:
        raise SignatureError("secret key: the public half does not match the seed")
    return SecretKey(key_id, seed, public)


def format_secret_key(key: SecretKey, comment: str = "minisign secret key (unencrypted)") -> str:
    secret = key.seed + key.public
    raw = (
        ALG_LEGACY
        + KDF_NONE
        + CHECKSUM_ALG
        + bytes(32)  # salt: unused without a password
        + bytes(16)  # opslimit, memlimit: unused without a password
        + key.key_id
        + secret
        + _secret_checksum(key.key_id, secret)
    )
    return f"{UNTRUSTED}{comment}\n{base64.b64encode(raw).decode()}\n"


def generate_keypair() -> SecretKey:
    """A new key with a random key id (a throwaway key for tests, or a new release key)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    seed = os.urandom(32)
    Ed25519PrivateKey.from_private_bytes(seed)  # validates that the library accepts it
    return SecretKey(os.urandom(8), seed, _public_from_seed(seed))


def _public_from_seed(seed: bytes) -> bytes:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    private = Ed25519PrivateKey.from_private_bytes(seed)
    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def parse_signature(text: str | bytes) -> Signature:
    lines = _lines(text, "signature", 4)
    untrusted = _comment(lines[0], UNTRUSTED, "signature")
    raw = _b64(lines[1], "signature", 74)
    if raw[:2] not in (ALG_PREHASHED, ALG_LEGACY):
        raise SignatureError(f"signature: unknown algorithm {raw[:2]!r}")
    trusted = _comment(lines[2], TRUSTED, "signature")
    global_signature = _b64(lines[3], "signature (global)", 64)
    return Signature(raw[:2], raw[2:10], raw[10:], trusted, global_signature, untrusted)


def format_signature(sig: Signature) -> str:
    untrusted = (
        sig.untrusted_comment or f"signature from minisign secret key {key_id_hex(sig.key_id)}"
    )
    return (
        f"{UNTRUSTED}{untrusted}\n"
        f"{base64.b64encode(sig.algorithm + sig.key_id + sig.signature).decode()}\n"
        f"{TRUSTED}{sig.trusted_comment}\n"
        f"{base64.b64encode(sig.global_signature).decode()}\n"
    )


def _message(algorithm: bytes, data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=64).digest() if algorithm == ALG_PREHASHED else data


def sign(
    data: bytes,
    key: SecretKey,
    trusted_comment: str,
    untrusted_comment: str = "",
    *,
    prehashed: bool = True,
) -> str:
    """The text of a minisign signature file over `data`."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if "\n" in trusted_comment or "\r" in trusted_comment or "\n" in untrusted_comment:
        raise SignatureError("comments must be one line")
    private = Ed25519PrivateKey.from_private_bytes(key.seed)
    algorithm = ALG_PREHASHED if prehashed else ALG_LEGACY
    signature = private.sign(_message(algorithm, data))
    global_signature = private.sign(signature + trusted_comment.encode())
    return format_signature(
        Signature(
            algorithm, key.key_id, signature, trusted_comment, global_signature, untrusted_comment
        )
    )


def verify(data: bytes, signature: str | bytes | Signature, key: PublicKey) -> Signature:
    """Check `signature` over `data` with `key`; returns the parsed signature (its trusted
    comment is now authentic) or raises SignatureError saying what failed."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    sig = signature if isinstance(signature, Signature) else parse_signature(signature)
    if sig.key_id != key.key_id:
        raise SignatureError(
            f"signed with key {key_id_hex(sig.key_id)}, not with the trusted key {key.key_id_hex}"
        )
    try:
        public = Ed25519PublicKey.from_public_bytes(key.key)
    except ValueError:
        raise SignatureError("public key: not a valid Ed25519 key") from None
    try:
        public.verify(sig.signature, _message(sig.algorithm, data))
    except InvalidSignature:
        raise SignatureError("signature does not match the data") from None
    try:
        public.verify(sig.global_signature, sig.signature + sig.trusted_comment.encode())
    except InvalidSignature:
        raise SignatureError("the trusted comment was altered (global signature fails)") from None
    return sig
