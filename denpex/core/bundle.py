"""Checks an air-gapped bundle (the .tar.gz or its unpacked folder) before anything installs it:
the minisign signature over SHA256SUMS, every listed file's SHA-256, and no file unlisted.

Read-only; never extracts, executes or trusts anything from the bundle other than as data.
The same rules as the bundle's install.sh (dist_scripts/bundle/install.sh):
  - the signature must verify with the release public key the bundle carries;
  - the operator names the key they trust (--pubkey) and the carried key must be that same
    key, so the signature verifies with the trusted key too; the carried key alone proves the
    bundle intact, not who made it, so relying on it takes an explicit `trust_carried`;
  - every file but SHA256SUMS and its signature is listed, and every listed file matches.
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from denpex.core import signing

SUMS = "SHA256SUMS"
SIGNATURE = "SHA256SUMS.minisig"
PUBLIC_KEY = "denpex-release.pub"
UNLISTED = frozenset({SUMS, SIGNATURE})
_SUM_LINE = re.compile(r"^([0-9a-f]{64}) [ *](.+)$")


class BundleError(Exception):
    """The bundle is not intact or not signed by the right key: do not install it."""


@dataclass(frozen=True)
class BundleCheck:
    name: str  # the bundle's top folder, e.g. denpex-airgap-bundle-0.1.0-x86_64
    files: int
    key_id: str
    trusted_comment: str
    origin_checked: bool  # True when the operator's own key verified the signature


def parse_sums(text: str) -> dict[str, str]:
    """SHA256SUMS (sha256sum's output) as {relative path: hex digest}; rejects unsafe paths."""
    sums: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line:
            continue
        match = _SUM_LINE.match(line)
        if match is None:
            raise BundleError(f"{SUMS} line {number}: not '<sha256>  <path>'")
        digest, path = match.groups()
        _check_relative(path, f"{SUMS} line {number}")
        if path in sums:
            raise BundleError(f"{SUMS} line {number}: {path} listed twice")
        sums[path] = digest
    if not sums:
        raise BundleError(f"{SUMS} lists no files")
    return sums


def _check_relative(path: str, where: str) -> None:
    parts = PurePosixPath(path).parts
    if not parts or path.startswith("/") or ".." in parts or "\\" in path or "\x00" in path:
        raise BundleError(f"{where}: unsafe path {path!r}")


def check_bundle(
    path: str | os.PathLike[str],
    trusted: signing.PublicKey | None,
    *,
    trust_carried: bool = False,
) -> BundleCheck:
    """Verify a bundle tarball or folder against the `trusted` release key (or, with
    `trust_carried`, the key the bundle carries); raises BundleError saying what is wrong."""
    if trusted is None and not trust_carried:
        raise BundleError(
            "no release key to trust: name your own copy of the denpex release key (the key "
            "a bundle carries proves it intact, not who made it)"
        )
    path = Path(path)
    if path.is_dir():
        name, entries = path.name, dict(_folder_entries(path))
    elif path.is_file():
        name, entries = _tar_entries(path)
    else:
        raise BundleError(f"{path}: no such file or folder")
    for required in (SUMS, SIGNATURE, PUBLIC_KEY):
        if required not in entries:
            raise BundleError(f"{required} is missing: not a signed denpex bundle")
    carried = _public_key(entries[PUBLIC_KEY][1], f"{PUBLIC_KEY} in the bundle")
    if trusted is not None and trusted != carried:
        raise BundleError(
            f"the bundle carries release key {carried.key_id_hex}, not the key you trust "
            f"({trusted.key_id_hex}): it was not made by the holder of your key"
        )
    sums_data = entries[SUMS][1]
    try:
        sig = signing.verify(sums_data, entries[SIGNATURE][1], trusted or carried)
    except signing.SignatureError as exc:
        raise BundleError(f"{SIGNATURE}: {exc}") from None
    try:
        sums = parse_sums(sums_data.decode("utf-8"))
    except UnicodeDecodeError:
        raise BundleError(f"{SUMS}: not UTF-8 text") from None
    for rel, (digest, _) in sorted(entries.items()):
        if rel in UNLISTED:
            continue
        if rel not in sums:
            raise BundleError(f"{rel}: present in the bundle but not listed in {SUMS}")
        if digest != sums[rel]:
            raise BundleError(f"{rel}: SHA-256 differs from {SUMS} (altered or damaged)")
    missing = sorted(set(sums) - set(entries))
    if missing:
        raise BundleError(f"{missing[0]}: listed in {SUMS} but missing from the bundle")
    return BundleCheck(
        name, len(sums), carried.key_id_hex, sig.trusted_comment, origin_checked=bool(trusted)
    )


def _public_key(data: bytes, what: str) -> signing.PublicKey:
    try:
        return signing.parse_public_key(data)
    except signing.SignatureError as exc:
        raise BundleError(f"{what}: {exc}") from None


# entries: {relative path: (sha256 hex, contents if it is one of the small signed files)}
Entry = tuple[str, bytes]


def _digest(stream, rel: str) -> Entry:
    hasher = hashlib.sha256()
    keep = rel in (SUMS, SIGNATURE, PUBLIC_KEY)
    kept = bytearray()
    while chunk := stream.read(1 << 20):
        hasher.update(chunk)
        if keep:
            kept += chunk
            if len(kept) > 1 << 24:
                raise BundleError(f"{rel}: implausibly large")
    return hasher.hexdigest(), bytes(kept)


def _folder_entries(root: Path) -> Iterator[tuple[str, Entry]]:
    for folder, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            full = Path(folder, name)
            rel = full.relative_to(root).as_posix()
            if full.is_symlink():
                raise BundleError(f"{rel}: a symbolic link (a bundle holds plain files only)")
            if name in files:
                if not full.is_file():
                    raise BundleError(f"{rel}: not a plain file")
                with open(full, "rb") as stream:
                    yield rel, _digest(stream, rel)


def _tar_entries(path: Path) -> tuple[str, dict[str, Entry]]:
    entries: dict[str, Entry] = {}
    top: str | None = None
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                name = member.name.removeprefix("./").rstrip("/")
                if not name:
                    continue
                _check_relative(name, path.name)
                head, _, rel = name.partition("/")
                if top is None:
                    top = head
                elif head != top:
                    raise BundleError(f"{name}: outside the bundle's one top folder {top}/")
                if member.isdir():
                    continue
                if not member.isfile():
                    raise BundleError(f"{name}: not a plain file (link or device)")
                if not rel or rel in entries:
                    raise BundleError(f"{name}: duplicate or misplaced entry")
                stream = tar.extractfile(member)
                assert stream is not None
                entries[rel] = _digest(stream, rel)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise BundleError(f"{path.name}: not a readable .tar.gz ({exc})") from None
    if top is None:
        raise BundleError(f"{path.name}: empty archive")
    return top, entries
