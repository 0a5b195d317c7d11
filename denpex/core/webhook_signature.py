"""The signature of denpex's outgoing webhooks (remediation steps, notifications, RMA
tickets): HMAC-SHA256 over `<timestamp>.<body>` with the receiver's shared secret, sent with
the timestamp, so a receiver checks both the bytes and their age (a replay window).

Pure: bytes, a secret and a clock value in, headers or a verdict out. It never sends anything
and never accepts a signature outside the window or one compared in variable time.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

TIMESTAMP_HEADER = "X-Denpex-Timestamp"  # seconds since the epoch, an integer
SIGNATURE_HEADER = "X-Denpex-Signature"  # "v1=" + hex HMAC-SHA256
DELIVERY_HEADER = "X-Denpex-Delivery"  # the idempotency key: the same for every retry
VERSION = "v1"
DEFAULT_WINDOW_S = 300  # a signed request older or newer than this is refused


class SignatureError(ValueError):
    """A request whose signature is missing, wrong, or outside the replay window."""


def signature(secret: bytes, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256)
    return f"{VERSION}={mac.hexdigest()}"


def sign(secret: bytes, body: bytes, now_s: float, delivery: str) -> dict[str, str]:
    """The headers a signed request carries."""
    ts = int(now_s)
    return {
        TIMESTAMP_HEADER: str(ts),
        SIGNATURE_HEADER: signature(secret, ts, body),
        DELIVERY_HEADER: delivery,
    }


def verify(
    secret: bytes,
    body: bytes,
    headers: Mapping[str, str],
    now_s: float,
    *,
    window_s: float = DEFAULT_WINDOW_S,
) -> int:
    """Check a received request; return its timestamp, or raise SignatureError saying why."""
    lowered = {k.lower(): v for k, v in headers.items()}
    raw_ts = lowered.get(TIMESTAMP_HEADER.lower(), "")
    given = lowered.get(SIGNATURE_HEADER.lower(), "")
    if not raw_ts.isdigit() or not given:
        raise SignatureError(f"missing {TIMESTAMP_HEADER} or {SIGNATURE_HEADER}")
    ts = int(raw_ts)
    if abs(now_s - ts) > window_s:
        raise SignatureError(f"timestamp {ts} is outside the {window_s:g} s replay window")
    if not hmac.compare_digest(signature(secret, ts, body), given):
        raise SignatureError("signature does not match the body")
    return ts
