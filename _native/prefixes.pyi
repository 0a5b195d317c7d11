from .prefixes_ref import Stripped as Stripped  # one definition, beside the twin

fallbacks: int

def strip_prefixes(
    body: bytes,
    year: int | None,
    ts_ns: int | None,
    host: str | None,
    rank: int | None,
    pid: int | None,
    source: str,
) -> Stripped: ...
