"""The text both rankers see: a passage's or a query's text without the tokens that name one
run (timestamps, hosts, ids, long numbers, directories), by the rules of data/normalise.yaml.

Shared by the embedding index and the BM25 baseline, so they index and search the same words.
Pure text in, text out; what is shown to a reader is always the original text, never this.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path

import orjson
import yaml

from denpex.core import caches

RULES_FILE = "normalise.yaml"
_SPACE = re.compile(r"\s+")


@cache
def rules() -> tuple[tuple[re.Pattern[str], str], ...]:
    """(compiled pattern, replacement) in the order the data file gives them."""
    path = resources.files("denpex.retrieval") / "data" / RULES_FILE
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return tuple((re.compile(r["pattern"]), str(r.get("to", " "))) for r in raw["rules"])


def normalise(text: str) -> str:
    known = _KNOWN.get(text)
    return known if known is not None else _normalise(text)


@lru_cache(maxsize=16384)  # the runbook index and BM25 normalise the same passages
def _normalise(text: str) -> str:
    for pattern, to in rules():
        text = pattern.sub(to, text)
    return _SPACE.sub(" ", text).strip()


# the texts of the runbook index, normalised once per process (or read from the cache folder)
_KNOWN: dict[str, str] = {}


def normalise_ahead(texts: list[str], folder: Path | None = None) -> None:
    """Normalise `texts` (a runbook index's: ~3,000 passages, ~0.3 s) so that `normalise`
    finds them; taken from the cache folder when an earlier process normalised these very
    texts by these very rules, and kept there for the next one. The same results either way."""
    texts = [t for t in dict.fromkeys(texts) if t not in _KNOWN]
    if not texts:
        return
    rules_text = (resources.files("denpex.retrieval") / "data" / RULES_FILE).read_bytes()
    digest = hashlib.sha256(rules_text + caches.source_identity(__name__))
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        digest.update(b"%d:" % len(data) + data)
    path = (folder or caches.cache_dir("retrieval")) / f"normalised-{digest.hexdigest()[:32]}.json"
    try:
        kept = orjson.loads(path.read_bytes())
        if not (isinstance(kept, list) and len(kept) == len(texts)):
            raise ValueError("not ours")
        done = [str(text) for text in kept]
    except (OSError, ValueError):  # absent or damaged (JSONDecodeError is a ValueError)
        done = [_normalise(text) for text in texts]
        caches.replace_file(path, orjson.dumps(done), stale="normalised-*.json")
    _KNOWN.update(zip(texts, done, strict=True))
