"""JSON in and out through orjson, the one JSON codec denpex uses."""

from __future__ import annotations

from typing import Any

import orjson


def dumps(obj: Any, *, pretty: bool = False) -> bytes:
    option = orjson.OPT_NON_STR_KEYS
    if pretty:
        option |= orjson.OPT_INDENT_2
    return orjson.dumps(obj, option=option)


def loads(data: bytes | str) -> Any:
    return orjson.loads(data)
