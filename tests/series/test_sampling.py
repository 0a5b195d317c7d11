"""Which lines of a log the series parser reads: all of a short log, a sample of a long one
that is the same however the log is cut into batches, every non-finite value, and the end of
each log kept for a last look."""

from __future__ import annotations

import random

import pytest

from denpex.series.sampling import FULL_PARSE_LINES, LineSampler, Tail

# the sampler finds non-finite values with the native matcher: on it and on its twin
pytestmark = pytest.mark.usefixtures("both_backends")


def log_lines(count: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    print("seed", seed)
    lines = []
    for step in range(1, count + 1):
        if step % 3 == 0:
            lines.append(b"NCCL INFO Channel 00/02 : 0[0] -> 1[1] via P2P/IPC")
        lines.append(b"[rank%d]: step=%d loss=%.4f" % (step % 8, step, 2 + rng.random()))
    return lines


def chosen(lines: list[bytes], batch_sizes: list[int]) -> list[int]:
    """The line numbers chosen over the whole log, fed in batches of these sizes (cycled)."""
    sampler, picked, start, turn = LineSampler(), [], 0, 0
    while start < len(lines):
        batch = lines[start : start + batch_sizes[turn % len(batch_sizes)]]
        picked += [start + i for i in sampler.lines_to_read("log", b"\n".join(batch))]
        start, turn = start + len(batch), turn + 1
    return picked


def test_a_short_log_is_read_whole():
    lines = log_lines(FULL_PARSE_LINES // 2, seed=1)
    assert chosen(lines, [97]) == [i for i, line in enumerate(lines) if b"loss" in line]


def test_a_long_log_is_sampled_alike_however_it_is_batched():
    lines = log_lines(60_000, seed=2)
    one = chosen(lines, [len(lines)])
    assert one == chosen(lines, [1, 50, 4096, 333]) == chosen(lines, [1000])
    with_numbers = sum(b"loss" in line for line in lines)
    assert FULL_PARSE_LINES < len(one) < with_numbers // 4
    assert all(b"loss" in lines[i] for i in one)
    ranks = {lines[i].split(b"]")[0] for i in one[FULL_PARSE_LINES:]}
    assert len(ranks) == 8  # the gaps vary: a round-robin log is sampled over every rank


def test_every_non_finite_value_is_read():
    lines = log_lines(60_000, seed=3)
    spots = [30_001, 45_000, 59_999]
    lines[spots[0]] = b"[rank1]: step=1 loss=nan"
    lines[spots[1]] = b"[rank2]: {'loss': 'inf', 'grad_norm': '0.1'}"
    lines[spots[2]] = b" iteration 9/ 10 | lm loss: NAN | loss scale: 1.0 |"
    assert set(spots) <= set(chosen(lines, [777]))


def test_the_tail_is_the_last_bytes_of_a_log_as_the_batches_holding_them():
    tail: Tail[str] = Tail(size=100)
    for name, size in [("a", 60), ("b", 60), ("c", 30), ("d", 50)]:
        tail.keep("log", size, name)
    # c and d hold 80 bytes: the last 20 of b complete the tail, its first 40 lie before it
    assert tail.batches("log") == [(40, "b"), (0, "c"), (0, "d")]
    tail.keep("log", 500, "e")
    assert tail.batches("log") == [(400, "e")] and tail.batches("other") == []
