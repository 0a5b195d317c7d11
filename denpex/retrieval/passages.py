"""The passages retrieval searches: runbook entries (every signature's and detector's
explanation, sections of the docs, a site's own runbook folders) and past incidents.

Pure text in, Passage records out: nothing here embeds, stores or prints. Each passage has a
stable id that the retrieval block cites (`runbook:<signature id>`, `doc:<file>#<n>`,
`site:<file>#<n>`, `incident:<id>`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from denpex.catalog import Catalog
    from denpex.core.taxonomy import Taxonomy

PROBES = 2  # example log lines indexed with a signature's entry (its first ones)
CHUNK_CHARS = 900  # about 200 tokens: under the model's 256-token window
SITE_SUFFIXES = (".md", ".txt", ".rst")
# docs generated from the catalog repeat what its own entries say
GENERATED_DOCS = frozenset({"signatures.md"})
_HEADING = re.compile(r"^#{1,4}\s+(.+?)\s*$")


@dataclass(frozen=True, slots=True)
class Passage:
    id: str
    kind: str  # "signature" | "detector" | "doc" | "site" | "incident"
    title: str
    text: str
    category: str = ""
    resolution: str = ""  # incidents: how it was resolved, by whom, when
    # log lines that stand for the entry too (a signature's examples): a query made of log
    # lines meets its entry through them as well as through the prose
    probes: tuple[str, ...] = ()

    @property
    def texts(self) -> tuple[str, ...]:
        """Everything indexed for this passage: its text, then its probes."""
        return (self.text, *self.probes)

    def to_dict(self) -> dict[str, str]:
        out = {"id": self.id, "kind": self.kind, "title": self.title, "text": self.text}
        if self.category:
            out["category"] = self.category
        if self.resolution:
            out["resolution"] = self.resolution
        return out

    def to_json(self) -> dict[str, Any]:
        """to_dict plus the probes: what the shipped file keeps."""
        out: dict[str, Any] = dict(self.to_dict())
        if self.probes:
            out["probes"] = list(self.probes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Passage:
        return cls(
            id=str(data["id"]),
            kind=str(data["kind"]),
            title=str(data.get("title", "")),
            text=str(data["text"]),
            category=str(data.get("category", "")),
            resolution=str(data.get("resolution", "")),
            probes=tuple(str(t) for t in data.get("probes") or ()),
        )


def text_key(text: str) -> str:
    """What a stored vector is keyed by: the text it was computed from."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _plain(template: str) -> str:
    """A summary template without its placeholders: `{count} process(es)` → `process(es)`."""
    return re.sub(r"\s+", " ", re.sub(r"\{[^}]*\}", "", template)).strip(" :,")


def catalog_passages(catalog: Catalog, taxonomy: Taxonomy | None = None) -> list[Passage]:
    """One passage per signature and per detector: what it means and what to do."""
    out: list[Passage] = []
    entries: list[tuple[str, Any]] = [("detector", d) for d in catalog.detectors.values()]
    entries += [("signature", s) for s in catalog.signatures]
    for kind, entry in entries:
        title = _plain(entry.summary)
        if taxonomy is not None and entry.category in taxonomy:
            heading = taxonomy[entry.category].title
        else:
            heading = entry.category
        text = f"{heading}: {title}. {entry.explain}".strip()
        probes = tuple(t.strip() for t in getattr(entry, "examples_match", [])[:PROBES])
        out.append(Passage(f"runbook:{entry.id}", kind, title, text, entry.category, probes=probes))
    # a site-local signature overrides a shipped detector of the same id: keep the last
    return list({p.id: p for p in out}.values())


def chunk_markdown(text: str, limit: int = CHUNK_CHARS) -> list[tuple[str, str]]:
    """(heading, body) pieces of a markdown or plain text file, each at most `limit`
    characters, split at headings, then at blank lines (code fences kept whole)."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        found = None if fenced else _HEADING.match(line)
        if found:
            sections.append((found.group(1).strip("# "), []))
        else:
            sections[-1][1].append(line)
    pieces: list[tuple[str, str]] = []
    for heading, lines in sections:
        body = "\n".join(lines).strip()
        if not body:
            continue
        current = ""
        for para in re.split(r"\n\s*\n", body):
            para = para.strip()
            if current and len(current) + len(para) + 2 > limit:
                pieces.append((heading, current))
                current = ""
            current = f"{current}\n\n{para}" if current else para
            while len(current) > limit:
                pieces.append((heading, current[:limit]))
                current = current[limit:]
        if current:
            pieces.append((heading, current))
    return pieces


def folder_passages(folder: Path, kind: str, prefix: str) -> list[Passage]:
    """Every markdown or text file under `folder`, chunked: `<prefix>:<file>#<n>`."""
    out: list[Passage] = []
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.suffix not in SITE_SUFFIXES:
            continue
        if kind == "doc" and path.name in GENERATED_DOCS:
            continue
        name = path.relative_to(folder).as_posix()
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for n, (heading, body) in enumerate(chunk_markdown(text), start=1):
            title = f"{name}: {heading}" if heading else name
            out.append(Passage(f"{prefix}:{name}#{n}", kind, title, f"{heading}\n{body}".strip()))
    return out


def site_runbook_dirs(extra: Iterable[str] = ()) -> list[Path]:
    """A site's runbook folders: the ones given, then DENPEX_RUNBOOKS (os.pathsep-separated);
    a folder that does not exist is left out (said by `missing_runbook_dirs`)."""
    names = list(extra)
    env = os.environ.get("DENPEX_RUNBOOKS")
    if env:
        names.extend(p for p in env.split(os.pathsep) if p)
    return [Path(n) for n in names if Path(n).is_dir()]


def missing_runbook_dirs(extra: Iterable[str] = ()) -> list[str]:
    names = list(extra) + [p for p in os.environ.get("DENPEX_RUNBOOKS", "").split(os.pathsep) if p]
    return [n for n in names if not Path(n).is_dir()]


def incident_passage(incident: Mapping[str, Any], resolution: str = "") -> Passage:
    """A past incident as retrieval sees it: its title, category and explanation."""
    title = str(incident.get("title") or incident.get("category") or "incident")
    text = f"{incident.get('category', '')}: {title}. {incident.get('explanation', '')}"
    return Passage(
        f"incident:{incident['id']}",
        "incident",
        title,
        text.strip(),
        str(incident.get("category") or ""),
        resolution,
    )
