"""Functions for DDP, FSDP and DeepSpeed engines: the mapping of a DeepSpeed-like engine object
(DeepSpeed itself is not installed in the test environment), and real gloo ranks for DDP,
FSDP2 and an engine whose data-parallel group is a real sub-group."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest

pytest.importorskip("torch", reason="sdk.integrations.distributed needs torch")
import denpex.sdk.integrations.distributed as integration

CHILD = Path(__file__).parent / "children" / "integ_distributed_job.py"


def test_engine_parts_prefer_the_sequence_data_parallel_group() -> None:
    engine = SimpleNamespace(
        module="m",
        optimizer="o",
        data_parallel_group="dp",
        seq_data_parallel_group="sdp",
        global_rank=5,
        zero_optimization_stage=lambda: 2,
    )
    parts = integration.engine_parts(engine)
    assert (parts.module, parts.optimizer, parts.group, parts.rank) == ("m", "o", "sdp", 5)
    assert parts.replicated
    engine.seq_data_parallel_group = None
    engine.zero_optimization_stage = lambda: 3
    parts = integration.engine_parts(engine)
    assert parts.group == "dp" and not parts.replicated


def test_loss_scale_of_engine_or_optimizer() -> None:
    assert (
        integration.loss_scale_of(SimpleNamespace(optimizer=SimpleNamespace(cur_scale=1024)))
        == 1024.0
    )
    assert integration.loss_scale_of(SimpleNamespace(loss_scale=8.0)) == 8.0
    assert integration.loss_scale_of(SimpleNamespace(optimizer=object())) is None


def test_plain_module_without_distributed_watches_the_world() -> None:
    import torch

    found = integration.replicas_of(torch.nn.Linear(2, 2))
    assert found.group is None and found.replicated


def test_mapping_on_real_gloo_ranks(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [sys.executable, str(CHILD), str(tmp_path), str(port)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 1):
        result = orjson.loads((tmp_path / f"integ-{rank}.json").read_bytes())
        assert result["ddp_group_is_model_group"] and result["ddp_replicated"]
        assert "fsdp2_error" not in result, result["fsdp2_error"]
        assert result["fsdp2_group_is_mesh_group"] and not result["fsdp2_replicated"]
        assert result["fsdp2_replicas_option"] is False
        assert result["engine_model"] and result["engine_optimizer"] and result["engine_group"]
        assert result["engine_rank"] == rank and result["engine_replicas_option"] is False
        assert result["evidence"] == []
