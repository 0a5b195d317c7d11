"""The native line splitter gives exactly what its pure-Python twin gives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from denpex import _native
from denpex._native import linesplit_ref

chunks = st.lists(
    st.binary(max_size=64).map(lambda b: b.replace(b"a", b"\n").replace(b"b", b"\r")), max_size=12
)


def run(cls, cap, parts):
    splitter = cls(cap)
    out = [splitter.feed(p) for p in parts]
    out.append(splitter.flush())
    return out, splitter.truncated_bytes


def test_reference_semantics():
    s = linesplit_ref.LineSplitter(4)
    assert s.feed(b"ab\r\ncd\rlong-line\npart") == [b"ab", b"cd", b"long"]
    assert s.truncated_bytes == len(b"-line")
    assert s.feed(b"ial\n") == [b"part"]  # 'ial' is past the cap of 4
    assert s.flush() == []
    s.feed(b"dangling")
    s.reset()
    assert s.flush() == [] and s.discarded_bytes == 4


@pytest.mark.skipif(_native.backend("linesplit") != "native", reason="extension not built")
@settings(max_examples=400, deadline=None)
@given(st.sampled_from([1, 2, 5, 16, 65536]), chunks)
def test_native_equals_reference(cap, parts):
    from denpex._native import linesplit

    assert run(linesplit.LineSplitter, cap, parts) == run(linesplit_ref.LineSplitter, cap, parts)
