"""The ingest bus's wire contract, shared by the agent that publishes and the server that
consumes (NATS JetStream): the stream, the subject of each credential and kind, the message
id that lets the stream drop a republished batch, and the signature header.

A message's subject names the token that sent it (`denpex.ingest.<token id>.<kind>`), never
a tenant: the consuming server finds the token, checks the signature with the token's stored
hash, and takes the tenant from that token. The signature is HMAC-SHA256 keyed by the
SHA-256 of the token's secret (what the server stores), over the subject, the message id
and the SHA-256 of the payload, so a reader of the stream can neither forge a message nor
learn the secret. Pure: no I/O, no clock; it must never accept a subject it cannot parse.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable

STREAM = "DENPEX_INGEST"
SUBJECT_ROOT = "denpex.ingest"
SUBJECTS = f"{SUBJECT_ROOT}.>"
KINDS = ("logs", "metrics")
MSG_ID = "Nats-Msg-Id"  # JetStream drops a second message with an id seen in its window
SIGNATURE = "Denpex-Signature"
DUPLICATE_WINDOW_S = 600.0
_SUBJECT = re.compile(r"^denpex\.ingest\.([0-9a-f]{16})\.(logs|metrics)$")


class BusError(ValueError):
    """A message that does not follow the contract (refused, never retried)."""


def subject(token_id: str, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"bus message kind {kind!r}: one of {', '.join(KINDS)}")
    name = f"{SUBJECT_ROOT}.{token_id}.{kind}"
    if not _SUBJECT.match(name):
        raise ValueError(f"token id {token_id!r} is not 16 hex digits")
    return name


def parse_subject(name: str) -> tuple[str, str]:
    """(token id, kind) of a message subject; BusError for anything else."""
    match = _SUBJECT.match(name)
    if match is None:
        raise BusError(f"subject {name!r} is not {SUBJECT_ROOT}.<token id>.<logs|metrics>")
    return match.group(1), match.group(2)


def message_id(kind: str, event_ids: Iterable[str], payload: bytes) -> str:
    """The id JetStream deduplicates on: from the batch's event ids when it has them (a
    re-encoded batch of the same evidence gets the same id), else from its bytes."""
    digest = hashlib.sha256(kind.encode())
    ids = sorted(event_ids)
    if ids:
        for event_id in ids:
            digest.update(b"\0" + event_id.encode())
    else:
        digest.update(b"\1" + payload)
    return digest.hexdigest()[:40]


def sign(secret_hash: str, name: str, msg_id: str, payload: bytes) -> str:
    """The signature header's value for one message (`secret_hash`: hash_secret(secret))."""
    text = f"{name}\n{msg_id}\n{hashlib.sha256(payload).hexdigest()}".encode()
    return hmac.new(secret_hash.encode(), text, hashlib.sha256).hexdigest()


def signature_matches(
    secret_hash: str, name: str, msg_id: str, payload: bytes, signature: str
) -> bool:
    return hmac.compare_digest(sign(secret_hash, name, msg_id, payload), signature)
