"""`denpex audit export|verify|head`: the control plane's hash-chained audit log (DESIGN §7).

export writes every record (one canonical JSON line each) and an anchor naming the head,
signed with the site key when --sign-key is given; verify checks a file or the store and
exits 0 intact, 1 naming the first bad record. It must never modify the log.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from denpex.cli.common import UsageError, db_option, open_store

HELP = """\
examples:
  denpex audit export --db postgresql://denpex@db:5432/denpex --sign-key site.key > audit.jsonl
  denpex audit verify audit.jsonl --pubkey site.pub
  denpex audit verify --db postgresql://denpex@db:5432/denpex
  denpex audit head --db sqlite:///var/lib/denpex/cp.db --sign-key site.key > head.json

exit status: 0 intact, 1 tampered (the first bad line is named), 2 usage error.
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "audit",
        help="export or verify the hash-chained audit log",
        description="Export or verify the control plane's hash-chained audit log.",
        epilog=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    export = sub.add_parser("export", help="write the log as JSON lines with a head anchor")
    db_option(export)
    export.add_argument("--sign-key", metavar="KEY", help="minisign secret key (the site key)")
    export.set_defaults(handler=handle_export)
    head = sub.add_parser("head", help="print the head anchor (keep it apart, signed)")
    db_option(head)
    head.add_argument("--sign-key", metavar="KEY", help="minisign secret key (the site key)")
    head.set_defaults(handler=handle_head)
    verify = sub.add_parser("verify", help="check an export (or the store) end to end")
    verify.add_argument("file", nargs="?", help="an export (- for stdin); or give --db")
    db_option(verify)
    verify.add_argument("--pubkey", metavar="KEY", help="the site's minisign public key")
    verify.add_argument(
        "--anchor", metavar="FILE", help="a head anchor kept apart: the log must reach it"
    )
    verify.set_defaults(handler=handle_verify)


def _read_key(path: str, secret: bool):  # -> signing.SecretKey | signing.PublicKey
    from denpex.core import signing

    try:
        with open(path, "rb") as stream:
            data = stream.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return signing.parse_secret_key(data) if secret else signing.parse_public_key(data)
    except signing.SignatureError as exc:
        raise UsageError(f"{path}: {exc}") from None


def _anchor(head, key_path: str | None) -> bytes:  # head: audit.Head
    from denpex.core import audit

    signature = audit.sign_anchor(head, _read_key(key_path, True)) if key_path else None
    return audit.anchor_line(head, signature)


def handle_export(args: argparse.Namespace) -> int:
    from denpex.control import audit_log

    db = open_store(args).db
    out = sys.stdout.buffer
    head = audit_log.current_head(db)
    from denpex.core import audit

    last = audit.EMPTY
    for line in audit_log.export_lines(db):
        out.write(line + b"\n")
        last = audit.head_of(audit.loads_record(line))
        if last.seq >= head.seq:
            break  # records appended while exporting belong to the next export
    out.write(_anchor(last, args.sign_key) + b"\n")
    out.flush()
    print(f"denpex audit: {last.seq} records, head {last.hash}", file=sys.stderr)
    return 0


def handle_head(args: argparse.Namespace) -> int:
    from denpex.control import audit_log

    head = audit_log.current_head(open_store(args).db)
    sys.stdout.buffer.write(_anchor(head, args.sign_key) + b"\n")
    return 0


def _lines(args: argparse.Namespace) -> Iterable[bytes]:
    if args.file and args.db:
        raise UsageError("give a file or --db, not both")
    if args.file == "-":
        return sys.stdin.buffer.read().splitlines()
    if args.file:
        try:
            with open(args.file, "rb") as stream:
                return stream.read().splitlines()
        except OSError as exc:
            raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    if not args.db:
        raise UsageError("give an export file or --db URL")
    from denpex.control import audit_log

    return audit_log.store_lines(open_store(args).db)


def handle_verify(args: argparse.Namespace) -> int:
    from denpex.core import audit, signing

    lines = list(_lines(args))
    verdict = audit.verify_lines(lines)
    if not verdict.ok:
        print(f"denpex audit: TAMPERED: {verdict.describe()}", file=sys.stderr)
        return 1
    if args.pubkey and verdict.anchor is not None and not args.db:
        try:
            audit.verify_anchor(verdict.anchor, verdict.signature, _read_key(args.pubkey, False))
        except signing.SignatureError as exc:
            print(f"denpex audit: TAMPERED: the head anchor: {exc}", file=sys.stderr)
            return 1
    if args.anchor:
        try:
            with open(args.anchor, "rb") as stream:
                kept = audit.loads_record(stream.read().strip())[audit.ANCHOR_KEY]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--anchor {args.anchor}: not an anchor ({exc})") from None
        kept_head = audit.Head(int(kept["seq"]), str(kept["hash"]))
        if not audit.contains(lines, kept_head):
            print(
                f"denpex audit: TAMPERED: the log no longer reaches the kept anchor "
                f"(record {kept_head.seq} {kept_head.hash})",
                file=sys.stderr,
            )
            return 1
    print(f"denpex audit: {verdict.describe()}")
    return 0
