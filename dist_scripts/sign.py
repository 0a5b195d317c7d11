"""Release signing for the air-gapped bundle: make a key pair, sign a file, print a public key.

Writes minisign-compatible files (denpex.core.signing); `minisign -Vm FILE -p KEY` verifies
them. Never prints or logs a secret key.
usage: python dist_scripts/sign.py keygen DIR | sign --key SECRET FILE [--trusted TEXT] | pubkey --key SECRET
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from denpex.core import signing

SECRET_NAME = "denpex-release.key"
PUBLIC_NAME = "denpex-release.pub"


def keygen(folder: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True)
    secret_path, public_path = folder / SECRET_NAME, folder / PUBLIC_NAME
    if secret_path.exists():
        print(f"sign.py: {secret_path} exists; refusing to overwrite a key", file=sys.stderr)
        return 2
    key = signing.generate_keypair()
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as stream:
        stream.write(signing.format_secret_key(key, "denpex release secret key (unencrypted)"))
    public_path.write_text(signing.format_public_key(key.public_key()))
    print(f"key {key.public_key().key_id_hex}: {secret_path} (secret), {public_path} (public)")
    return 0


def load_secret(path: Path) -> signing.SecretKey:
    try:
        return signing.parse_secret_key(path.read_bytes())
    except OSError as exc:
        raise SystemExit(f"sign.py: cannot read the key {path}: {exc.strerror}") from None
    except signing.SignatureError as exc:
        raise SystemExit(f"sign.py: {path}: {exc}") from None


def sign_file(key_path: Path, target: Path, trusted: str | None) -> int:
    key = load_secret(key_path)
    trusted = trusted or f"timestamp:{int(time.time())}\tfile:{target.name}"
    text = signing.sign(
        target.read_bytes(),
        key,
        trusted,
        f"signature from denpex release key {key.public_key().key_id_hex}",
    )
    out = target.with_name(target.name + ".minisig")
    out.write_text(text)
    print(f"signed {target} -> {out} (key {key.public_key().key_id_hex})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sign.py", description=__doc__)
    actions = parser.add_subparsers(dest="action", required=True)
    gen = actions.add_parser("keygen", help="write a new key pair into DIR")
    gen.add_argument("dir", type=Path)
    sig = actions.add_parser("sign", help="write FILE.minisig")
    sig.add_argument("--key", type=Path, required=True)
    sig.add_argument("--trusted", help="the trusted (signed) comment")
    sig.add_argument("file", type=Path)
    pub = actions.add_parser("pubkey", help="print the public key of a secret key")
    pub.add_argument("--key", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.action == "keygen":
        return keygen(args.dir)
    if args.action == "sign":
        return sign_file(args.key, args.file, args.trusted)
    sys.stdout.write(signing.format_public_key(load_secret(args.key).public_key()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
