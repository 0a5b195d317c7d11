"""Typed surface of `denpex._native.otlp_logs`, the same as `otlp_logs_ref.decode_logs_request`.

Stub only: it must list exactly what the compiled module exposes, nothing more.
"""

from typing import Any

def decode_logs_request(
    data: bytes,
) -> list[tuple[dict[str, Any], list[tuple[int, int, str, Any, dict[str, Any]]]]]: ...
