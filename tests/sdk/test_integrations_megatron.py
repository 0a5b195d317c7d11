"""Megatron-Core: the data-parallel group from parallel_state is the replica group (tensor-
parallel peers are never compared), on real gloo ranks with megatron-core installed."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

pytest.importorskip("torch", reason="sdk.integrations.megatron needs torch")
pytest.importorskip("megatron.core", reason="needs megatron-core (the test extra installs it)")

CHILD = Path(__file__).parent / "children" / "integ_megatron_job.py"


def test_watch_before_initialize_says_what_to_do() -> None:
    from denpex.sdk.integrations.megatron import parallelism

    with pytest.raises(RuntimeError, match="initialize_model_parallel"):
        parallelism()


@pytest.mark.slow
def test_replicas_are_compared_only_inside_the_data_parallel_group(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), str(port)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = {
        rank: orjson.loads((tmp_path / f"megatron-{rank}.json").read_bytes()) for rank in range(4)
    }
    for rank, result in results.items():
        assert result["tensor_rank"] == rank % 2 and result["data_rank"] == rank // 2
        assert result["data_group"] == [rank % 2, rank % 2 + 2]
        assert (result["guard_rank"], result["data_world_size"]) == (rank, 2)
    # shards differ across tensor parallelism, yet nobody reports them; the flipped weight on
    # rank 3 is a replica mismatch in its own data-parallel group {1, 3} only
    for rank in (0, 2):
        assert not [s for s in results[rank]["evidence"] if s.startswith("train.sdc")], results
    flagged = {s for rank in (1, 3) for s in results[rank]["evidence"]}
    assert any(s.startswith("train.sdc") for s in flagged), results
