"""NCCL's `rank R nranks N cudaDev` lines are read for the world size without parsing their
prefixes (thousands of them in a long log): the facts learned are those of the full parse,
prefix by prefix, including prefixes that end where the NCCL words begin."""

from __future__ import annotations

import pytest

from denpex.core.scan_cues import LAUNCHER_WORDS, NRANKS, WORDS
from denpex.lite import processes
from denpex.lite.prefixes import parse_line
from denpex.lite.processes import JobFacts, LauncherState, learn

LINES = [
    b"node7:4100:4100 [3] NCCL INFO comm 0x55 rank 3 nranks 16 cudaDev 3 busId 3b000",
    b"[rank3]: node7:4100:4100 [3] NCCL INFO comm 0x55 rank 3 nranks 24 cudaDev 3 busId 1000",
    b"2026-11-30T05:00:00 nranks 99 cudaDev 1 busId 1000",  # the ISO prefix eats the space
    b"[rank1]: rank 1 nranks 32 cudaDev 1 busId 1000",
    b"comm 0x1 rank 0 nranks 8 cudaDev 0 WORLD_SIZE=64",  # two facts: parsed as ever
    b'{"MESSAGE": "comm 0x1 rank 0 nranks 48 cudaDev 0", "_HOSTNAME": "n1"}',
    b"rank 2 nranks 4 cudaDev 2 local_rank: 2",
    b"E0130 12:10:04.010000 90211 nccl.py:12] comm rank 5 nranks 128 cudaDev 5 busId 1",
    b"comm 0x1 rank 0 nranks 8 cudaDev 0 World Size is 64",  # `world` in any case: parsed
    b"comm 0x1 rank 0 NRANKS 8 CUDADEV 0 busId 1000",  # the case NCCL never prints
    b"rank 0 nranks 8 cudaDev 0 rank 1 nranks 12 cudaDev 1",  # two sizes in one line
]


def world_size(lines: list[bytes], *, words_found: bool = False) -> int | None:
    """What `learn` takes from `lines`: looking for its words itself, or told where they are
    (`words_found`: as the scanner tells it, from the catalog's pass)."""
    facts = JobFacts()
    joined = b"\n".join(lines)
    found = {w: [i for i, line in enumerate(lines) if w in line] for w in WORDS}
    learn(
        facts,
        LauncherState(),
        lines,
        joined,
        lambda i: parse_line(lines[i]),
        1,
        found if words_found else None,
    )
    return facts.world_size


@pytest.mark.parametrize("words_found", [False, True])
@pytest.mark.parametrize("line", LINES)
def test_the_shortcut_learns_what_the_full_parse_learns(line, words_found, monkeypatch):
    fast = world_size([line], words_found=words_found)
    monkeypatch.setattr(processes, "_nccl_world_size", lambda line, needles: None)
    assert fast == world_size([line], words_found=words_found)


def test_the_shortcut_is_taken_for_plain_nccl_lines_only():
    others = tuple(n for n in LAUNCHER_WORDS if n != NRANKS)
    assert processes._nccl_world_size(LINES[0], others) == 16
    assert processes._nccl_world_size(LINES[2], others) is None  # no `rank R` before it
    assert processes._nccl_world_size(LINES[4], others) is None
    assert processes._nccl_world_size(LINES[5], others) is None
    assert processes._nccl_world_size(LINES[6], others) is None  # local_rank: another fact
    assert processes._nccl_world_size(LINES[8], others) is None
    assert processes._nccl_world_size(LINES[9], others) is None
    assert processes._nccl_world_size(LINES[10], others) is None
    assert world_size(LINES) == world_size(LINES, words_found=True) == 128
