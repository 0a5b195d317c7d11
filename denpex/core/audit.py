"""The hash-chained audit log (DESIGN §7): each record carries SHA-256 over the previous
record's hash and its own canonical JSON, so a changed byte, a removed, reordered or inserted
record breaks the chain; an anchor (the head's sequence number and hash, signed with the site
key when one is configured) at the end of an export detects a truncated tail.

Pure: records and bytes in, records and verdicts out; it never reads a file, a clock or a
database (the control plane stores the chain, the CLI reads and writes files).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import orjson
import yaml

from denpex.core import signing

GENESIS = "0" * 64  # the `prev` of the first record
ANCHOR_KEY = "anchor"


@cache
def kinds() -> Mapping[str, str]:
    """Every audit record kind and what it means (audit.yaml)."""
    text = resources.files("denpex.core").joinpath("audit.yaml").read_text()
    return {str(k): str(v) for k, v in yaml.safe_load(text).items()}


def canonical(obj: Any) -> bytes:
    """The one byte form of a JSON value: sorted keys, no whitespace, UTF-8."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)


def chain_hash(prev: str, body: Mapping[str, Any]) -> str:
    """SHA-256 over the previous hash (32 bytes) and the canonical JSON of the record
    without its own `hash`."""
    return hashlib.sha256(bytes.fromhex(prev) + canonical(body)).hexdigest()


@dataclass(frozen=True, slots=True)
class Head:
    seq: int  # 0: an empty chain
    hash: str

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "hash": self.hash}


EMPTY = Head(0, GENESIS)


def seal(
    head: Head,
    *,
    ts_ns: int,
    kind: str,
    actor: str,
    tenant: str | None,
    subject: str,
    why: Mapping[str, Any],
    result: Mapping[str, Any],
) -> dict[str, Any]:
    """The next record after `head`: who (`actor`: a user or `policy:<tier>`), what (`kind`,
    `subject`), why (incident and evidence ids) and the result, chained to `head`."""
    if kind not in kinds():
        raise ValueError(f"unknown audit kind {kind!r} (denpex/core/audit.yaml)")
    body = {
        "seq": head.seq + 1,
        "ts_ns": int(ts_ns),
        "kind": kind,
        "actor": actor,
        "tenant": tenant,
        "subject": subject,
        "why": dict(why),
        "result": dict(result),
        "prev": head.hash,
    }
    return {**body, "hash": chain_hash(head.hash, body)}


def loads_record(line: bytes) -> dict[str, Any]:
    value = orjson.loads(line)
    if not isinstance(value, dict):
        raise ValueError("not a record")
    return value


def head_of(record: Mapping[str, Any]) -> Head:
    return Head(int(record["seq"]), str(record["hash"]))


def anchor_message(head: Head) -> bytes:
    """The bytes a site key signs for an anchor."""
    return canonical({"denpex.audit.anchor": head.to_dict()})


def anchor_line(head: Head, signature: str | None) -> bytes:
    return canonical({ANCHOR_KEY: head.to_dict(), "signature": signature})


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    records: int  # intact records read before the first bad one (all of them when ok)
    head: Head  # the last intact record's head
    line: int | None = None  # 1-based line of the first bad record
    reason: str = ""
    anchor: Head | None = None
    signature: str | None = None  # the anchor's signature text, when it carries one

    def describe(self) -> str:
        if self.ok:
            return f"intact: {self.records} records, head {self.head.seq} {self.head.hash}"
        return f"line {self.line}: {self.reason}"


def verify_lines(lines: Iterable[bytes], *, require_anchor: bool = True) -> Verdict:
    """Check an export line by line (each line the canonical JSON of one record; the last,
    an anchor). The first line that breaks the chain is named."""
    head, count, anchor, signature = EMPTY, 0, None, None
    lineno = 0
    for lineno, raw in enumerate(lines, start=1):
        line = raw.rstrip(b"\n")
        if anchor is not None:
            return Verdict(False, count, head, lineno, "a record after the anchor")
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            return Verdict(False, count, head, lineno, "not JSON (bytes changed or cut)")
        if not isinstance(record, dict):
            return Verdict(False, count, head, lineno, "not a record")
        if canonical(record) != line:
            return Verdict(False, count, head, lineno, "not in canonical form (bytes changed)")
        if ANCHOR_KEY in record:
            problem, anchor, signature = _check_anchor(record, head)
            if problem:
                return Verdict(False, count, head, lineno, problem)
            continue
        problem = _check_record(record, head)
        if problem:
            return Verdict(False, count, head, lineno, problem)
        head, count = head_of(record), count + 1
    if anchor is None and require_anchor:
        reason = "no anchor at the end: the tail may have been cut"
        return Verdict(False, count, head, lineno + 1, reason)
    return Verdict(True, count, head, None, "", anchor, signature)


def _check_record(record: Mapping[str, Any], head: Head) -> str:
    seq = record.get("seq")
    if seq != head.seq + 1:
        return f"sequence {seq}, expected {head.seq + 1} (a record removed, reordered or inserted)"
    if record.get("prev") != head.hash:
        return f"record {seq}: its prev is not the hash of record {head.seq}"
    body = {k: v for k, v in record.items() if k != "hash"}
    try:
        expected = chain_hash(head.hash, body)
    except (TypeError, ValueError):
        return f"record {seq}: unreadable"
    if record.get("hash") != expected:
        return f"record {seq}: hash does not match its content (changed)"
    return ""


def _check_anchor(record: Mapping[str, Any], head: Head) -> tuple[str, Head | None, str | None]:
    data = record.get(ANCHOR_KEY)
    if not isinstance(data, dict) or set(record) != {ANCHOR_KEY, "signature"}:
        return "a malformed anchor", None, None
    anchor = Head(int(data.get("seq", -1)), str(data.get("hash")))
    if anchor != head:
        return f"the anchor names record {anchor.seq}, the chain ends at {head.seq}", None, None
    signature = record.get("signature")
    return "", anchor, signature if isinstance(signature, str) else None


def contains(lines: Iterable[bytes], anchor: Head) -> bool:
    """Whether the records hold `anchor` (an earlier anchor kept apart: the export must
    still reach it, so a cut below it is detected even when the end anchor was rewritten)."""
    for raw in lines:
        try:
            record = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return False
        if isinstance(record, dict) and record.get("seq") == anchor.seq:
            return record.get("hash") == anchor.hash
    return False


def sign_anchor(head: Head, key: signing.SecretKey) -> str:
    """A minisign signature over the anchor (the site key, as bundles are signed)."""
    comment = f"denpex audit head seq={head.seq} hash={head.hash}"
    return signing.sign(anchor_message(head), key, comment)


def verify_anchor(head: Head, signature: str | None, key: signing.PublicKey) -> None:
    """Raise signing.SignatureError unless `signature` is `key`'s over this anchor."""
    if not signature:
        raise signing.SignatureError("the anchor is not signed")
    signing.verify(anchor_message(head), signature, key)
