"""Input accounting of `denpex scan`: binary sniffing, the tails of over-long lines (any
chunking), following a file through truncation and rotation."""

from __future__ import annotations

import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from denpex.lite.scan_input import LongLineTails, follow, looks_binary

# the matcher, line splitter and ring buffer, compiled and pure Python (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("both_backends")


def test_binary_sniffing():
    assert looks_binary(b"step 1 loss 2.0\n\x1b[32mok\x1b[0m\r\n") is None
    assert looks_binary(b"\x7fELF\x02\x01\x01\x00\x00") == "it contains NUL bytes"
    assert "control characters" in (looks_binary(bytes(range(1, 32)) * 4) or "")
    assert looks_binary(b"") is None
    # the share counts control bytes only, tab, newline, CR, escape, backspace and form feed apart
    assert looks_binary(b"\x01\x02\x03abcdefg") == "30% of its first bytes are control characters"
    assert looks_binary(b"\x01\x02\x1b\t\n\r\x08\x0cab") is None
    assert looks_binary(b"\x01\x02\x7f\xffabcdef") is None


def expected_tails(data: bytes, cap: int) -> list[bytes]:
    return [line[-cap:] for line in data.replace(b"\r", b"\n").split(b"\n") if len(line) > cap]


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=12),
    cuts=st.lists(st.integers(1, 50), min_size=1, max_size=8),
    cap=st.integers(1, 12),
)
def test_tails_of_long_lines_whatever_the_chunking(lengths, cuts, cap):
    data = b"\n".join(bytes([65 + i % 26]) * n + b"%d" % i for i, n in enumerate(lengths))
    tails = LongLineTails(cap)
    found, at, index = [], 0, 0
    while at < len(data):
        size = cuts[index % len(cuts)]
        found += tails.feed(data[at : at + size])
        at, index = at + size, index + 1
    found += tails.flush()
    assert found == expected_tails(data, cap)
    assert tails.long_lines == len(found)


def test_a_ten_megabyte_line_keeps_its_end():
    cap = 64 << 10
    line = b"x" * (10 << 20) + b" RuntimeError: CUDA error: an illegal memory access"
    tails = LongLineTails(cap)
    out = []
    for at in range(0, len(line), 1 << 20):
        out += tails.feed(line[at : at + (1 << 20)], False)
    out += tails.feed(b"\nnext line\n", False)
    assert len(out) == 1 and out[0].endswith(b"illegal memory access") and len(out[0]) == cap
    assert tails.skipped_bytes == len(line) - 2 * cap


def test_follow_reads_through_truncation_and_rotation(tmp_path):
    path = tmp_path / "train.log"
    path.write_bytes(b"one\n")
    got: list[bytes] = []
    done = threading.Event()
    reader = threading.Thread(target=follow, args=(str(path), got.append, done.is_set))
    reader.start()

    def wait_for(text: bytes) -> None:
        deadline = time.monotonic() + 10
        while text not in b"".join(got):
            assert time.monotonic() < deadline, (text, got)
            time.sleep(0.02)

    try:
        wait_for(b"one")
        with open(path, "ab") as out:
            out.write(b"two\n")
        wait_for(b"two")
        path.write_bytes(b"3\n")  # truncated in place
        wait_for(b"3\n")
        os.rename(path, tmp_path / "train.log.1")  # rotated: a new file at the path
        path.write_bytes(b"four\n")
        wait_for(b"four")
    finally:
        done.set()
        reader.join(5)
    assert not reader.is_alive()
