"""The kept copy of the built-in catalog: read back, it is what validating and planning gave
(a catalog built on it matches, captures and prefilters alike); it is never read when
anything it depends on changed; and it is never in the way (a torn, foreign, corrupted or
unwritable cache only means validating again)."""

from __future__ import annotations

import shutil
from dataclasses import fields
from pathlib import Path

import orjson
import pytest

import denpex._native as native
from denpex.catalog import cache, loader
from denpex.catalog.catalog import Catalog
from denpex.catalog.loader import load_signatures
from denpex.catalog.schema import Signature
from tests.native.native_support import native_module

SHIPPED = loader.builtin_catalog_files()


def as_dicts(signatures: list[Signature]) -> list[dict]:
    return [
        {f.name: getattr(s, f.name) for f in fields(Signature) if f.name != "compiled"}
        | {"pattern": s.compiled.pattern if s.compiled else None}
        for s in signatures
    ]


def keep(folder: Path, files: list[Path] = SHIPPED) -> Catalog:
    catalog = Catalog(load_signatures(files))
    cache.write(files, catalog.signatures, catalog.plan, folder)
    return catalog


def test_read_back_it_is_what_validating_and_planning_gave(tmp_path: Path) -> None:
    fresh = keep(tmp_path)
    kept = cache.read(SHIPPED, tmp_path)
    assert kept is not None and len(list(tmp_path.glob("catalog-*.json"))) == 1
    assert as_dicts(kept.signatures) == as_dicts(fresh.signatures)
    if native.backend("matcher") == "native":
        assert kept.plan == fresh.plan is not None
    copied = Catalog(kept.signatures, plan=kept.plan)
    lines = [
        t.encode() for s in fresh.signatures for t in (*s.examples_match, *s.examples_no_match)
    ]
    found = [(m.line_index, m.signature.id) for m in copied.match_lines(lines)]
    assert found == [(m.line_index, m.signature.id) for m in fresh.match_lines(lines)]
    assert [s.captures(s.examples_match[0].encode()) for s in kept.signatures] == [
        s.captures(s.examples_match[0].encode()) for s in fresh.signatures
    ]
    assert copied.example_errors() == []


def test_the_native_matcher_on_a_kept_plan_finds_what_it_finds_on_its_own() -> None:
    matcher = native_module("matcher")
    patterns = [s.pattern for s in load_signatures()]
    own = matcher.Matcher(patterns)
    data = orjson.loads(orjson.dumps(own.plan.to_data()))
    again = matcher.Matcher(patterns, type(own.plan).from_data(data))
    corpus = b"\n".join(t.encode() for s in load_signatures() for t in s.examples_match) * 3
    assert again.scan(corpus) == own.scan(corpus) and len(own.scan(corpus)) > 1000


def test_a_changed_catalog_file_is_not_read(tmp_path: Path) -> None:
    folder = tmp_path / "signatures" / "gpu"
    folder.mkdir(parents=True)
    source = next(p for p in SHIPPED if p.parent.name == "gpu")
    copy = folder / source.name
    shutil.copy(source, copy)
    before = keep(tmp_path / "cache", [copy])
    assert cache.read([copy], tmp_path / "cache") is not None
    summary = before.signatures[0].summary
    copy.write_text(copy.read_text().replace(summary, summary + " (edited)", 1))
    assert cache.read([copy], tmp_path / "cache") is None
    keep(tmp_path / "cache", [copy])
    kept = cache.read([copy], tmp_path / "cache")
    assert kept is not None and kept.signatures[0].summary == summary + " (edited)"
    # the copy of the earlier catalog is removed, not kept beside the new one
    assert len(list((tmp_path / "cache").glob("catalog-*.json"))) == 1


def corrupt_one_value(blob: bytes) -> bytes:
    data = orjson.loads(blob)
    data["body"]["signatures"][3]["severity"] = "info"
    return orjson.dumps(data)


@pytest.mark.parametrize(
    "damage",
    [lambda b: b"", lambda b: b[: len(b) // 2], lambda b: b"[1, 2]",
     lambda b: b.replace(b'"format":1', b'"format":99'), corrupt_one_value],
    ids=["empty", "torn", "not ours", "other format", "a value changed"],
)  # fmt: skip
def test_a_damaged_copy_is_not_read(tmp_path: Path, damage) -> None:
    keep(tmp_path)
    (path,) = tmp_path.glob("catalog-*.json")
    path.write_bytes(damage(path.read_bytes()))
    assert cache.read(SHIPPED, tmp_path) is None


def test_an_unwritable_cache_folder_is_no_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be")
    keep(blocked / "catalog")
    assert cache.read(SHIPPED, blocked / "catalog") is None


def test_the_builtin_catalog_is_kept_once_and_read_after(tmp_path: Path, monkeypatch) -> None:
    from denpex.catalog import catalog as catalog_module

    monkeypatch.setenv("DENPEX_CACHE_DIR", str(tmp_path))
    catalog_module._builtin_catalog.cache_clear()
    try:
        first = catalog_module.load_catalog()
        catalog_module._builtin_catalog.cache_clear()

        def no_validation(*args, **kwargs):
            raise AssertionError("validated although a kept copy was there")

        monkeypatch.setattr(catalog_module, "load_signatures", no_validation)
        second = catalog_module.load_catalog()
        assert as_dicts(second.signatures) == as_dicts(first.signatures)
        assert second.plan == first.plan
    finally:
        catalog_module._builtin_catalog.cache_clear()
