"""The validated copy of the built-in catalog: the same signatures as validating, read back
without validating, never read when anything it depends on changed, and never in the way
(a torn, foreign or unwritable cache only means validating again)."""

from __future__ import annotations

import shutil
from dataclasses import fields
from pathlib import Path

import pytest

from denpex.catalog import cache, loader
from denpex.catalog.catalog import Catalog
from denpex.catalog.loader import CatalogError, load_signatures
from denpex.catalog.schema import Signature

SHIPPED = loader.builtin_catalog_files()


def as_dicts(signatures: list[Signature]) -> list[dict]:
    return [
        {f.name: getattr(s, f.name) for f in fields(Signature) if f.name != "compiled"}
        | {"pattern": s.compiled.pattern if s.compiled else None}
        for s in signatures
    ]


class Counting:
    """The loader, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, files: list[Path]) -> list[Signature]:
        self.calls += 1
        return load_signatures(files)


def test_read_back_it_is_what_validation_gave_and_validates_nothing(tmp_path: Path) -> None:
    validate = Counting()
    first = cache.builtin_signatures(SHIPPED, validate, tmp_path)
    second = cache.builtin_signatures(SHIPPED, validate, tmp_path)
    assert validate.calls == 1
    assert len(list(tmp_path.glob("catalog-*.json"))) == 1
    assert as_dicts(second) == as_dicts(first) == as_dicts(load_signatures(SHIPPED))
    # a catalog built on the copy matches and captures as the validated one does
    fresh, copied = Catalog(first), Catalog(second)
    lines = [t.encode() for s in first for t in s.examples_match]
    assert [(m.line_index, m.signature.id) for m in copied.match_lines(lines)] == [
        (m.line_index, m.signature.id) for m in fresh.match_lines(lines)
    ]
    assert [s.captures(s.examples_match[0].encode()) for s in second] == [
        s.captures(s.examples_match[0].encode()) for s in first
    ]
    assert copied.example_errors() == []


def test_a_changed_catalog_file_is_validated_again(tmp_path: Path) -> None:
    folder = tmp_path / "signatures" / "gpu"
    folder.mkdir(parents=True)
    source = next(p for p in SHIPPED if p.parent.name == "gpu")
    copy = folder / source.name
    shutil.copy(source, copy)
    validate = Counting()
    before = cache.builtin_signatures([copy], validate, tmp_path / "cache")
    text = copy.read_text()
    copy.write_text(text.replace(before[0].summary, before[0].summary + " (edited)", 1))
    after = cache.builtin_signatures([copy], validate, tmp_path / "cache")
    assert validate.calls == 2
    assert after[0].summary == before[0].summary + " (edited)"
    # the copy of the earlier catalog is removed, not kept beside the new one
    assert len(list((tmp_path / "cache").glob("catalog-*.json"))) == 1


def test_an_invalid_catalog_raises_and_leaves_no_copy(tmp_path: Path) -> None:
    broken = tmp_path / "bad" / "broken.yaml"
    broken.parent.mkdir()
    broken.write_text("- id: gpu.x\n  category: gpu.nope\n")
    with pytest.raises(CatalogError):
        cache.builtin_signatures([broken], None, tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("catalog-*.json"))


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b'{"format": 1, "digest": "other", "signatures": []}', b"[1, 2]",
     b'{"format": 1, "digest": "%s", "signatures": [{"id": "x"}]}'],
)  # fmt: skip
def test_a_torn_or_foreign_copy_means_validating_again(tmp_path: Path, content: bytes) -> None:
    validate = Counting()
    good = as_dicts(cache.builtin_signatures(SHIPPED, validate, tmp_path))
    (path,) = tmp_path.glob("catalog-*.json")
    path.write_bytes(content.replace(b"%s", cache._digest(SHIPPED).encode()))
    assert as_dicts(cache.builtin_signatures(SHIPPED, validate, tmp_path)) == good
    assert validate.calls == 2


def test_an_unwritable_cache_folder_is_no_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would be")
    validate = Counting()
    got = cache.builtin_signatures(SHIPPED, validate, blocked / "catalog")
    assert as_dicts(got) == as_dicts(load_signatures(SHIPPED)) and validate.calls == 1
