"""The versioned wire format between the training SDK and the local denpex (DESIGN §2, §3).

Pure encode/decode, no I/O: one message is one JSON line `{"v": 1, "type": "evidence"|"event",
...}` carrying the flat fields of core.wire; the stderr fallback writes the same JSON behind the
prefix `denpex-sdk: `. A decoder never raises on bad input from a stream: it skips and counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from denpex.core.events import Event, Evidence
from denpex.core.wire import (
    WireError,
    event_from_dict,
    event_to_dict,
    evidence_from_dict,
    evidence_to_dict,
)

WIRE_VERSION = 1
SUPPORTED_VERSIONS = (1,)
# the wrapper (`denpex run`) puts the path of its Unix socket here for the job's processes
SOCKET_ENV = "DENPEX_SDK_SOCKET"
STDERR_PREFIX = b"denpex-sdk: "
# a message is one line of at most this many bytes (newline included); longer ones are
# shrunk by the encoder and refused by the decoder, so one runaway field cannot stall a reader
MAX_LINE_BYTES = 64 * 1024
_TEXT_KEEP = 2048  # a long text field is cut to this many characters when a message is shrunk
_TYPES = ("evidence", "event")


class SdkWireError(WireError):
    """An SDK message that cannot be decoded: bad JSON, unknown version or type, bad fields."""


# --- encode --------------------------------------------------------------------------------


def message_dict(item: Evidence | Event) -> dict[str, Any]:
    """The versioned JSON object for one Evidence or Event."""
    if isinstance(item, Evidence):
        return {"v": WIRE_VERSION, "type": "evidence", **evidence_to_dict(item)}
    if isinstance(item, Event):
        return {"v": WIRE_VERSION, "type": "event", **event_to_dict(item)}
    raise SdkWireError(f"only Evidence and Event travel to denpex, not {type(item).__name__}")


def encode_message(item: Evidence | Event) -> bytes:
    """One JSON line (newline-terminated) of at most MAX_LINE_BYTES; long text is cut."""
    data = message_dict(item)
    line = _dump(data)
    if len(line) > MAX_LINE_BYTES:
        line = _dump(_shrink(data))
    if len(line) > MAX_LINE_BYTES:
        raise SdkWireError(f"message of {len(line)} bytes exceeds {MAX_LINE_BYTES} after shrinking")
    return line


def stderr_line(item: Evidence | Event) -> bytes:
    """The stderr fallback form: `denpex-sdk: {json}` and a newline, one line."""
    return STDERR_PREFIX + encode_message(item)


def _dump(data: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(data) + b"\n"
    except TypeError as exc:  # a value JSON cannot hold (core.wire allows scalars only)
        raise SdkWireError(f"message cannot be written as JSON: {exc}") from None


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > _TEXT_KEEP:
        return value[:_TEXT_KEEP] + "…"
    return value


def _shrink(data: dict[str, Any]) -> dict[str, Any]:
    """The same message with every long text cut, marked `attrs.truncated`."""
    out = {key: _cut(value) for key, value in data.items()}
    for name in ("attrs", "captures"):
        if isinstance(out.get(name), dict):
            out[name] = {k[:256]: _cut(v) for k, v in list(out[name].items())[:256]}
    out["attrs"] = {**out.get("attrs", {}), "truncated": True}
    return out


# --- coverage: a check the SDK could not run ---------------------------------------------
# An Event, not Evidence (nothing failed in the job): kind "state", body COVERAGE_LOST,
# attrs {"check": "checksums", "since_step": 5, "reason": "…"}; once per check and process.
COVERAGE_LOST = "sdk_coverage_lost"


def coverage_event(check: str, since_step: int, reason: str, **fields: Any) -> Event:
    """The Event saying that SDK check `check` has not run since step `since_step`, and why;
    `fields` are Event fields (host, rank, pid, job, ts_ns)."""
    attrs = {"check": check, "since_step": int(since_step), "reason": reason}
    return Event(body=COVERAGE_LOST, source="sdk", kind="state", attrs=attrs, **fields)


# --- decode --------------------------------------------------------------------------------


def decode_message(line: bytes | str) -> Evidence | Event:
    """The Evidence or Event one JSON line holds; SdkWireError says what is wrong with it."""
    raw = line.encode("utf-8", "replace") if isinstance(line, str) else line
    if len(raw) > MAX_LINE_BYTES:
        raise SdkWireError(f"line of {len(raw)} bytes exceeds the {MAX_LINE_BYTES}-byte cap")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SdkWireError(f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SdkWireError("an SDK message is a JSON object")
    version = data.pop("v", None)
    if version not in SUPPORTED_VERSIONS:
        raise SdkWireError(
            f"SDK wire version {version!r} is not supported (this denpex reads "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))}): use the same denpex version for the "
            "SDK and the wrapper"
        )
    kind = data.pop("type", None)
    if kind not in _TYPES:
        raise SdkWireError(f"SDK message 'type' must be one of {', '.join(_TYPES)}, not {kind!r}")
    try:
        return evidence_from_dict(data) if kind == "evidence" else event_from_dict(data)
    except SdkWireError:
        raise
    except WireError as exc:
        raise SdkWireError(str(exc)) from None


def stderr_payload(line: bytes) -> bytes | None:
    """The JSON after `denpex-sdk: ` in a log line (maybe behind a `[rank3]:` prefix), or None."""
    at = line.find(STDERR_PREFIX)
    if at < 0:
        return None
    payload = line[at + len(STDERR_PREFIX) :].strip()
    return payload if payload.startswith(b"{") else None


@dataclass(slots=True)
class DecodeStats:
    messages: int = 0
    garbage_lines: int = 0  # not JSON, wrong version or type, bad fields
    oversized_lines: int = 0  # longer than MAX_LINE_BYTES (skipped up to their newline)
    last_error: str = ""


class LineDecoder:
    """Splits a byte stream (one connection) into messages; bad lines are skipped and counted.

    Holds at most MAX_LINE_BYTES of a partial line: the rest of an over-long line is discarded
    as it arrives, so a peer that never sends a newline costs bounded memory."""

    def __init__(self, stats: DecodeStats | None = None) -> None:
        self.stats = stats if stats is not None else DecodeStats()
        self._partial = bytearray()
        self._skipping = False  # inside an over-long line: drop bytes up to its newline

    def feed(self, data: bytes) -> list[Evidence | Event]:
        out: list[Evidence | Event] = []
        start = 0
        while start < len(data):
            end = data.find(b"\n", start)
            piece = data[start:] if end < 0 else data[start:end]
            if self._skipping:
                if end >= 0:
                    self._skipping = False
            elif len(self._partial) + len(piece) >= MAX_LINE_BYTES:
                self._partial.clear()
                self.stats.oversized_lines += 1
                self._skipping = end < 0
            elif end < 0:
                self._partial += piece
            else:
                line = bytes(self._partial + piece) if self._partial else piece
                self._partial.clear()
                self._take(line, out)
            if end < 0:
                break
            start = end + 1
        return out

    def finish(self) -> list[Evidence | Event]:
        """End of stream: a last line without its newline still counts."""
        out: list[Evidence | Event] = []
        if self._partial and not self._skipping:
            self._take(bytes(self._partial), out)
        self._partial.clear()
        self._skipping = False
        return out

    def _take(self, line: bytes, out: list[Evidence | Event]) -> None:
        if not line.strip():
            return
        try:
            out.append(decode_message(line))
        except SdkWireError as exc:
            self.stats.garbage_lines += 1
            self.stats.last_error = str(exc)[:200]
            return
        self.stats.messages += 1
