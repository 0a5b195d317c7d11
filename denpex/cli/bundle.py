"""`denpex bundle verify`: checks an air-gapped bundle's signature and checksums.

Thin: the rules live in denpex.core.bundle; this module parses arguments and prints. It never
extracts or installs anything.
"""

from __future__ import annotations

import argparse
import sys

from denpex.cli.common import UsageError


def add_parser(commands) -> None:
    parser = commands.add_parser(
        "bundle",
        help="check an air-gapped bundle before installing it",
        description="Work with denpex-airgap-bundle-<version>-<arch>.tar.gz files.",
    )
    actions = parser.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)
    verify = actions.add_parser(
        "verify",
        help="check the signature and every file's checksum",
        description="Check a bundle (the .tar.gz, or the folder it unpacks to): the minisign "
        "signature over SHA256SUMS, every listed file's SHA-256, and that no unlisted file is "
        "present. The bundle must carry exactly the release key you pass with --pubkey; "
        "--trust-carried-key checks it with the key the bundle carries instead, which proves "
        "the bundle intact but not who made it. Exit status: 0 verified, 1 rejected, 2 bad "
        "usage.",
    )
    verify.add_argument("file", metavar="FILE", help="the bundle .tar.gz or its folder")
    trust = verify.add_mutually_exclusive_group()
    trust.add_argument(
        "--pubkey", metavar="KEY", help="a minisign public key file you trust (the release key)"
    )
    trust.add_argument(
        "--trust-carried-key",
        action="store_true",
        help="check with the key the bundle carries (intact, origin not proven)",
    )
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from denpex.core import jsonio, signing
    from denpex.core.bundle import BundleError, check_bundle

    trusted = None
    if args.pubkey:
        try:
            with open(args.pubkey, "rb") as stream:
                trusted = signing.parse_public_key(stream.read())
        except OSError as exc:
            raise UsageError(f"cannot read --pubkey {args.pubkey}: {exc.strerror}") from None
        except signing.SignatureError as exc:
            raise UsageError(f"--pubkey {args.pubkey}: {exc}") from None
    try:
        result = check_bundle(args.file, trusted, trust_carried=args.trust_carried_key)
    except BundleError as exc:
        if args.json:
            sys.stdout.buffer.write(jsonio.dumps({"ok": False, "error": str(exc)}) + b"\n")
        print(f"denpex bundle verify: REJECTED {args.file}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        data = {
            "ok": True,
            "bundle": result.name,
            "files": result.files,
            "key_id": result.key_id,
            "trusted_comment": result.trusted_comment,
            "origin_checked": result.origin_checked,
        }
        sys.stdout.buffer.write(jsonio.dumps(data, pretty=True) + b"\n")
        return 0
    print(f"verified: {result.name}: {result.files} files match SHA256SUMS")
    print(f"signed by release key {result.key_id}: {result.trusted_comment}")
    if not result.origin_checked:
        print(
            "note: checked with the key the bundle carries (--trust-carried-key): intact, "
            "origin not proven; pass --pubkey with the release key you trust",
            file=sys.stderr,
        )
    return 0
