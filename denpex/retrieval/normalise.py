"""The text both rankers see: a passage's or a query's text without the tokens that name one
run (timestamps, hosts, ids, long numbers, directories), by the rules of data/normalise.yaml.

Shared by the embedding index and the BM25 baseline, so they index and search the same words.
Pure text in, text out; what is shown to a reader is always the original text, never this.
"""

from __future__ import annotations

import re
from functools import cache, lru_cache
from importlib import resources

import yaml

RULES_FILE = "normalise.yaml"
_SPACE = re.compile(r"\s+")


@cache
def rules() -> tuple[tuple[re.Pattern[str], str], ...]:
    """(compiled pattern, replacement) in the order the data file gives them."""
    path = resources.files("denpex.retrieval") / "data" / RULES_FILE
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return tuple((re.compile(r["pattern"]), str(r.get("to", " "))) for r in raw["rules"])


@lru_cache(maxsize=16384)  # the runbook index and BM25 normalise the same passages
def normalise(text: str) -> str:
    for pattern, to in rules():
        text = pattern.sub(to, text)
    return _SPACE.sub(" ", text).strip()
