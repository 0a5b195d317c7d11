"""The board identities `denpex run` puts in its job report (denpex.gpu.nvml.boards): the
real pynvml against the fake libnvidia-ml.so.1 in a fresh process per scenario — each GPU's
serial, UUID and VBIOS by PCI bus id, a board without a serial (NOT_SUPPORTED, as on
GeForce), an unreadable GPU left out, a hung NVML call that costs the report its serials and
not its time, and no driver at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from denpex.gpu.nvml.scenario import SCENARIO_ENV, compile_scenario, write_lines

REPO = Path(__file__).resolve().parents[2]
LOOKUP = textwrap.dedent(
    """
    import json, os, sys, time
    from denpex.gpu.nvml.boards import BoardLookup
    started = time.monotonic()
    lookup = BoardLookup()
    boards = lookup.result(float(sys.argv[1]))
    print(json.dumps({"boards": boards, "problem": lookup.problem,
                      "waited_s": time.monotonic() - started}))
    sys.stdout.flush()
    os._exit(0)  # a deliberately hung NVML call must not hold up interpreter exit
    """
)


def look(library: Path | None, tmp_path: Path, scenario: dict[str, Any], wait_s: float = 10):
    lines = write_lines(compile_scenario(scenario), tmp_path / "scenario.txt")
    env = {**os.environ, SCENARIO_ENV: str(lines), "PYTHONPATH": str(REPO)}
    env["LD_LIBRARY_PATH"] = str(library.parent) if library else str(tmp_path / "no-driver")
    env.pop("DENPEX_NVML_SHIM", None)
    result = subprocess.run(
        [sys.executable, "-c", LOOKUP, str(wait_s)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_each_board_is_named_by_its_serial_uuid_and_vbios(fake_library, tmp_path):
    scenario = {
        "gpus": 3,
        "gpu": {
            0: {"serial": "1652923012345", "vbios_version": "96.00.99.00.01"},
            1: {"error:nvmlDeviceGetSerial": "not_supported"},  # a board with no serial
            2: {"error:nvmlDeviceGetHandleByIndex_v2": "unknown"},  # cannot be read at all
        },
    }
    found = look(fake_library, tmp_path, scenario)
    assert found["problem"] is None
    assert found["boards"] == {
        "00000000:18:00.0": {
            "serial": "1652923012345",
            "uuid": "GPU-00000000-fake-4e56-8d2f-000000000000",
            "vbios": "96.00.99.00.01",
        },
        "00000000:28:00.0": {
            "uuid": "GPU-00000001-fake-4e56-8d2f-000000000001",
            "vbios": "96.00.89.00.01",
        },
    }


def test_a_hung_nvml_costs_the_report_its_serials_not_its_time(fake_library, tmp_path):
    scenario = {"gpus": 1, "timeline": [{"t": 0, "gpu": 0, "hang": "nvmlDeviceGetSerial"}]}
    found = look(fake_library, tmp_path, scenario, wait_s=0.5)
    assert found["boards"] == {} and found["waited_s"] < 5
    assert "NVML did not answer within 0.5 s" in found["problem"]


def test_no_driver_says_so(tmp_path):
    found = look(None, tmp_path, {"gpus": 1})
    assert found["boards"] == {} and "GPU serials not read" in found["problem"]
    assert "NVML Shared Library Not Found" in found["problem"]
