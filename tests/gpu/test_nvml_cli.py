"""`denpex agent --once --json` on an NVML scenario (DENPEX_NVML_SHIM) with an Xid 79 at t=0:
the evidence names gpu.fallen_off_bus with the host and the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_agent_once_json_reports_xid79_as_fallen_off_bus(tmp_path: Path) -> None:
    scenario = tmp_path / "xid79_t0.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "description": "Xid 79 at start",
                "gpus": 8,
                "timeline": [{"t": 0, "gpu": 3, "xid": 79}],
            }
        )
    )
    env = {
        **os.environ,
        "DENPEX_NVML_SHIM": "1",
        "DENPEX_NVML_SCENARIO": str(scenario),
        "DENPEX_CACHE_DIR": str(tmp_path / "cache"),
        "PYTHONPATH": str(REPO),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "denpex",
            "agent",
            "--once",
            "--json",
            "--collectors",
            "nvml",
            "--host",
            "gpunode1",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode in (0, 1), result.stderr
    data = json.loads(result.stdout)
    assert "nvml" not in data["unavailable"], data["unavailable"]
    lost = [e for e in data["evidence"] if e["category"] == "gpu.fallen_off_bus"]
    assert lost, data["evidence"]
    text = json.dumps(lost[0])
    assert "gpunode1" in text and "00000000:48:00.0" in text and "nvml_xid79" in text
