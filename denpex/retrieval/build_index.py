"""`python -m denpex.retrieval.build_index`: build the runbook index that ships with the
package (doc sections and the vectors of every runbook passage) into denpex/retrieval/data.

Run at build time, from a source tree, with the `rag` extra installed; the wheel and the
frozen binaries carry its output. Never run at run time: run time only reads it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from denpex.retrieval.index import SHIPPED_PASSAGES, SHIPPED_VECTORS, VectorStore, data_dir
from denpex.retrieval.passages import folder_passages

SOURCE_DOCS = Path(__file__).resolve().parents[2] / "docs"


def build(docs: Path, out: Path) -> tuple[int, int]:
    """(doc passages, vectors) written under `out`."""
    from denpex.catalog import load_catalog
    from denpex.retrieval.embedding import Embedder
    from denpex.retrieval.runbook import runbook_passages

    doc_passages = folder_passages(docs, "doc", "doc")
    passages = runbook_passages(load_catalog(), docs=docs, site_dirs=[])
    store = VectorStore.shipped()  # only changed texts are embedded again
    store.vectors_for(passages, Embedder.load())
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps([p.to_json() for p in doc_passages], indent=1, ensure_ascii=False)
    (out / SHIPPED_PASSAGES).write_text(text + "\n", encoding="utf-8")
    return len(doc_passages), store.save(out / SHIPPED_VECTORS, passages)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=Path, default=SOURCE_DOCS, help="the docs folder")
    parser.add_argument("--out", type=Path, default=data_dir(), help="where to write")
    args = parser.parse_args(argv)
    if not args.docs.is_dir():
        print(f"build_index: no docs folder at {args.docs}; run it from a source tree")
        return 2
    docs, vectors = build(args.docs, args.out)
    print(f"build_index: {docs} doc passages, {vectors} vectors in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
