"""The optional rewrite: a local OpenAI-compatible endpoint (DENPEX_LLM_URL, off by default)
turns the deterministic summary and the retrieved passages into one readable paragraph.

The model only rewords: it is given nothing but the summary and the cited passages, and its
answer is kept only if it cites exactly the ids it was given (none dropped, none invented)
and still names the root cause's category. Anything else, and any failure of the endpoint,
discards the rewrite with a reason; the deterministic summary is always printed first anyway.
"""

from __future__ import annotations

import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from denpex.core import jsonio
from denpex.retrieval.block import RetrievalBlock

DEFAULT_TIMEOUT_S = 10.0
MAX_TOKENS = 400
_CITATION = re.compile(r"\[([A-Za-z][\w.:#/-]*)\]")
SYSTEM = (
    "You rewrite an incident summary for an on-call engineer. Use only the facts in the "
    "summary and the passages given. Keep every citation exactly as written, in square "
    "brackets, e.g. [runbook:cuda.oom.alloc] or [e12]; cite nothing else. Do not change the "
    "root cause. Answer with one short paragraph of plain text."
)


@dataclass(frozen=True, slots=True)
class Rewrite:
    text: str | None  # None: discarded or not asked
    reason: str = ""  # why it was discarded


def endpoint(url: str) -> str:
    """The chat-completions URL of a base URL (`http://host:8000`, `…/v1`, or the full one)."""
    url = url.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")


def configured() -> str | None:
    return os.environ.get("DENPEX_LLM_URL") or None


ROOT_LINE = "Root cause (name it word for word): "


def prompt(summary: str, block: RetrievalBlock, category: str | None = None) -> str:
    lines = [f"Summary (deterministic, cites evidence {', '.join(block.evidence)}):", summary, ""]
    if category:
        lines[2:2] = [ROOT_LINE + category]
    lines.append("Passages:")
    for hit in block.incidents + block.runbook:
        p = hit.passage
        extra = f" Resolution: {p.resolution}." if p.resolution else ""
        lines.append(f"[{p.id}] {p.text}{extra}")
    lines.append("")
    lines.append("Citations to keep: " + " ".join(f"[{c}]" for c in sorted(block.citations())))
    return "\n".join(lines)


def check(text: str, block: RetrievalBlock, category: str | None) -> str:
    """'' when `text` is acceptable, else why not."""
    cited = set(_CITATION.findall(text))
    wanted = block.citations()
    dropped, invented = sorted(wanted - cited), sorted(cited - wanted)
    if invented:
        return f"it cites what it was not given: {', '.join(invented)}"
    if dropped:
        return f"it dropped citations: {', '.join(dropped)}"
    prose = _CITATION.sub("", text)  # a citation naming the category does not count
    if category and category != "unknown" and category not in prose:
        return f"it no longer names the root cause {category}"
    return ""


def rewrite(
    summary: str,
    block: RetrievalBlock,
    category: str | None,
    *,
    url: str | None = None,
    model: str | None = None,
    timeout_s: float | None = None,
) -> Rewrite:
    url = url or configured()
    if not url:
        return Rewrite(None, "no DENPEX_LLM_URL")
    body = {
        "model": model or os.environ.get("DENPEX_LLM_MODEL", "local"),
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": prompt(summary, block, category)},
        ],
    }
    headers = {"Content-Type": "application/json"}
    key = os.environ.get("DENPEX_LLM_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    limit = timeout_s or float(os.environ.get("DENPEX_LLM_TIMEOUT", DEFAULT_TIMEOUT_S))
    request = urllib.request.Request(endpoint(url), jsonio.dumps(body), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=limit) as reply:
            answer: Any = jsonio.loads(reply.read())
        text = answer["choices"][0]["message"]["content"]
    except urllib.error.HTTPError as err:
        return Rewrite(None, f"the endpoint answered HTTP {err.code}")
    except (OSError, ValueError) as exc:  # refused, timed out, not JSON
        return Rewrite(None, f"the endpoint is unreachable or broken: {exc}"[:200])
    except (KeyError, IndexError, TypeError):
        return Rewrite(None, "the endpoint's answer has no choices[0].message.content")
    if not isinstance(text, str) or not text.strip():
        return Rewrite(None, "the endpoint answered with no text")
    problem = check(text, block, category)
    return Rewrite(None, problem) if problem else Rewrite(text.strip())


def rewritten_lines(diag: dict[str, Any], block: RetrievalBlock) -> list[str]:
    """What a report adds under the block when DENPEX_LLM_URL is set: the rewrite, or a note
    saying why it was discarded; nothing when the endpoint is not configured."""
    if not configured() or not (block.runbook or block.incidents):
        return []
    category = (diag.get("root_cause") or {}).get("category")
    done = rewrite(str(diag.get("summary") or ""), block, category)
    if done.text is None:
        return [f"note: rewrite discarded: {done.reason}"]
    return [
        "rewritten by the local model (from the passages above, citations checked)",
        f"  {done.text}",
    ]
