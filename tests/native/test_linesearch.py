"""Long lines go to RE2 and give exactly the answers of `re`: every signature's examples, padded
past the long-line threshold, and random lines spliced from them (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from denpex._native import linesearch
from denpex._native.linesearch import LONG_LINE, LineSearch
from denpex._native.literals import compile_pattern
from denpex.catalog import load_signatures

SIGNATURES = load_signatures()
PADDING = (b"", b"x" * (LONG_LINE + 1), b" " * (LONG_LINE + 1), b"\xff\xfe" * LONG_LINE)

pytestmark = pytest.mark.skipif(
    linesearch.engine() != "re2", reason="google-re2 is not installed (it is a dependency)"
)


def _by_re(pattern: str, line: bytes) -> dict | None:
    found = compile_pattern(pattern).search(line)
    return None if found is None else found.groupdict()


def test_long_lines_are_searched_by_re2():
    search = LineSearch("(?i)hello (?P<who>[a-z]{1,8})")
    assert search.search(b"say HELLO world")
    assert search._long is None, "a short line must not build the RE2 program"
    long_line = b"." * LONG_LINE + b" say HELLO world"
    assert search.groups(long_line) == {"who": b"world"}
    assert search._long not in (None, False), "the long line did not go to RE2"


def test_invalid_utf8_is_one_character_per_byte_like_re():
    search = LineSearch(r"ab[^\n]{1,3}z")
    line = b"x" * LONG_LINE + b"ab\xff\xfez"
    assert search.search(line) and _by_re(search.pattern, line) is not None


@pytest.mark.parametrize("sig", SIGNATURES, ids=lambda s: s.id)
def test_every_example_gives_the_same_answer_on_long_lines(sig):
    search = LineSearch(sig.pattern)
    for text in (*sig.examples_match, *sig.examples_no_match):
        for head in PADDING:
            for tail in PADDING:
                line = head + text.encode("utf-8") + tail
                want = _by_re(sig.pattern, line)
                assert search.search(line) == (want is not None), (sig.id, len(line), text)
                assert search.groups(line) == want, (sig.id, len(line), text)


_pieces = st.sampled_from(
    [e.encode() for s in SIGNATURES[:200] for e in (*s.examples_match, *s.examples_no_match)]
    + [b" ", b"\xff", b"rank 3", b"0000:3b:00.0", b"Error", b"(", b")", b":"]
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    pieces=st.lists(_pieces, min_size=1, max_size=8),
    index=st.integers(0, len(SIGNATURES) - 1),
    pad=st.integers(LONG_LINE - 50, LONG_LINE + 500),
)
def test_spliced_long_lines_agree_with_re(pieces, index, pad):
    sig = SIGNATURES[index]
    body = b" ".join(pieces)
    line = (b"z" * max(0, pad - len(body))) + body
    search = LineSearch(sig.pattern)
    assert search.groups(line) == _by_re(sig.pattern, line), (sig.id, line[-200:])
