"""The ctypes mirrors in denpex/host/ebpf/layouts.py against the structs of bpf/*.h: the
sizes and offsets the build measured with the C compiler (layouts.json), and no struct
left without a mirror."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from denpex.host.ebpf.layouts import MIRRORS
from tests.host.ebpf_support import REPO, build_module, built_dir


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict:
    return json.loads((built_dir(tmp_path_factory.mktemp("layouts")) / "layouts.json").read_text())


def test_every_header_struct_has_a_mirror() -> None:
    build = build_module()
    declared = {
        name
        for header in build.shared_headers()
        for name in build.struct_fields(header.read_text())
    }
    assert declared == set(MIRRORS)


def test_struct_fields_parser() -> None:
    text = "struct a {\n\t__u64 x; /* c; */\n\tchar comm[LEN];\n\t__s32 y;\n};\n"
    assert build_module().struct_fields(text) == {"a": ["x", "comm", "y"]}


@pytest.mark.parametrize("name", sorted(MIRRORS))
def test_mirror_matches_c_layout(layouts: dict, name: str) -> None:
    mirror = MIRRORS[name]
    c = layouts[name]
    assert ctypes.sizeof(mirror) == c["size"], name
    py_fields = {
        f[0]: (getattr(mirror, f[0]).offset, getattr(mirror, f[0]).size) for f in mirror._fields_
    }
    assert py_fields == {field: tuple(v) for field, v in c["fields"].items()}


def test_installed_layouts_are_current(tmp_path: Path, layouts: dict) -> None:
    """The package's layouts.json (when built) was made from these headers."""
    installed = REPO / "denpex" / "host" / "bpf" / "layouts.json"
    if not installed.exists():
        pytest.skip("no objects built into denpex/host/bpf (python bpf/build.py)")
    assert json.loads(installed.read_text()) == layouts
