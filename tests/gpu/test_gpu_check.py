"""scripts/gpu-check.sh without a GPU (every check SKIP, exit 0, as CI sees it) and its checks'
own logic against the fakes found by name on the loader path, as the real libraries would be:
the NVML check against the fake libnvidia-ml.so.1 and an nvidia-smi that agrees or not, the
DCGM check against the fake libdcgm of each major version and one that refuses."""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from denpex.gpu.nvml.scenario import SCENARIO_ENV, compile_scenario, write_lines

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu-check.sh"
CHECKS = REPO / "scripts" / "gpu_check.py"
NAMES = [
    "nvml-real-driver",
    "dcgm",
    "sdk-nan-hook-cuda",
    "sdk-checksums-cuda",
    "sdk-canary-cuda",
    "cupti",
    "run-cuda-oom",
    "run-cuda-illegal-address",
    "report-board-serials",
    "keras-fit-gpu",
]
UUID = "GPU-5a1e0c3d-77aa-4e2b-9c1f-0123456789ab"
DRIVER = "570.124.06"
# what nvidia-smi prints where the kernel driver is not running (and exits 9)
SMI_NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running."
)


def _bin_without_nvidia_smi(tmp_path: Path, smi: str | None = None) -> dict[str, str]:
    """An environment whose PATH has python and the usual tools, and `smi` as nvidia-smi
    (a shell script body) or no nvidia-smi at all."""
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    for tool in ("timeout", "grep", "head", "env", "sh", "bash", "dirname", "cat"):
        found = shutil.which(tool)
        if found:
            (folder / tool).symlink_to(found)
    (folder / "python3").symlink_to(sys.executable)
    if smi is not None:
        (folder / "nvidia-smi").write_text(f"#!/bin/sh\n{smi}\n")
        (folder / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": str(folder), "PYTHON": sys.executable}
    env.pop("DENPEX_NVML_SHIM", None)
    return env


def _run_script(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120
    )


def _check_lines(stdout: str) -> list[tuple[str, str]]:
    return [
        (line.split()[0], line.split()[1].rstrip(":"))
        for line in stdout.splitlines()
        if line.startswith(("PASS ", "FAIL ", "SKIP "))
    ]


def test_without_nvidia_smi_every_check_skips_and_it_exits_0(tmp_path: Path) -> None:
    done = _run_script(_bin_without_nvidia_smi(tmp_path))
    assert done.returncode == 0, done.stderr
    assert _check_lines(done.stdout) == [("SKIP", name) for name in NAMES]
    assert "no NVIDIA GPU" in done.stdout and "nvidia-smi not found" in done.stdout


def test_an_nvidia_smi_that_cannot_reach_the_driver_means_no_gpu(tmp_path: Path) -> None:
    env = _bin_without_nvidia_smi(tmp_path, f'echo "{SMI_NO_DRIVER}"; exit 9')
    done = _run_script(env)
    assert done.returncode == 0, done.stderr
    assert _check_lines(done.stdout) == [("SKIP", name) for name in NAMES]
    assert "couldn't communicate with the NVIDIA driver" in done.stdout


def test_the_script_and_the_checks_name_the_same_checks() -> None:
    done = subprocess.run(
        [sys.executable, str(CHECKS), "--no-gpu", "test"], capture_output=True, text=True
    )
    assert done.returncode == 0
    assert _check_lines(done.stdout) == [("SKIP", name) for name in NAMES]


def _one(name: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**env, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(CHECKS), "--one", name],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def nvml_env(fake_library: Path, tmp_path: Path) -> dict[str, str]:
    """The fake NVML found as libnvidia-ml.so.1 on the loader path, one GPU."""
    scenario = {"gpus": 1, "driver_version": DRIVER, "gpu": {0: {"uuid": UUID}}}
    lines = write_lines(compile_scenario(scenario), tmp_path / "scenario.txt")
    env = _bin_without_nvidia_smi(tmp_path, f'echo "{UUID}, {DRIVER}"')
    return {**env, "LD_LIBRARY_PATH": str(fake_library.parent), SCENARIO_ENV: str(lines)}


def test_nvml_check_passes_where_pynvml_nvidia_smi_and_the_collector_agree(
    nvml_env: dict[str, str],
) -> None:
    done = _one("nvml-real-driver", nvml_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("PASS nvml-real-driver: 1 GPU(s), driver 570.124.06")


def test_nvml_check_fails_when_nvidia_smi_sees_other_gpus(
    nvml_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "bin" / "nvidia-smi").write_text(f'#!/bin/sh\necho "GPU-other, {DRIVER}"\n')
    done = _one("nvml-real-driver", nvml_env)
    assert done.returncode == 1 and done.stdout.startswith("FAIL nvml-real-driver: pynvml sees")


def test_nvml_check_fails_on_a_lost_gpu(nvml_env: dict[str, str], tmp_path: Path) -> None:
    scenario = {"gpus": 1, "driver_version": DRIVER, "gpu": {0: {"uuid": UUID, "lost": 1}}}
    write_lines(compile_scenario(scenario), Path(nvml_env[SCENARIO_ENV]))
    done = _one("nvml-real-driver", nvml_env)
    assert done.returncode == 1 and done.stdout.startswith("FAIL nvml-real-driver:"), done.stdout


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVML is installed here"
)
def test_nvml_check_fails_without_a_driver_library(tmp_path: Path) -> None:
    env = {**_bin_without_nvidia_smi(tmp_path, f'echo "{UUID}, {DRIVER}"'), "LD_LIBRARY_PATH": ""}
    done = _one("nvml-real-driver", env)
    assert done.returncode == 1 and "NVMLError_LibraryNotFound" in done.stdout


DCGM_SCENARIO = (
    f"value 0 1 s {DRIVER}\nvalue 0 50 s NVIDIA H100 80GB HBM3\nvalue 0 54 s {UUID}\n"
    "value 0 57 s 00000000:3B:00.0\nvalue 0 1002 d 0.5\ngpus 1\n"
)


@pytest.mark.parametrize("major", [3, 4])
def test_dcgm_check_passes_on_each_major_version(
    fake_dcgms: dict[int, Path], tmp_path: Path, major: int
) -> None:
    folder = tmp_path / f"dcgm{major}"
    folder.mkdir()
    (folder / f"libdcgm.so.{major}").symlink_to(fake_dcgms[major])
    (tmp_path / "dcgm.txt").write_text(DCGM_SCENARIO)
    env = {
        **_bin_without_nvidia_smi(tmp_path),
        "LD_LIBRARY_PATH": str(folder),
        "DENPEX_FAKE_DCGM_SCENARIO": str(tmp_path / "dcgm.txt"),
    }
    done = _one("dcgm", env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"PASS dcgm: DCGM {major}, 1 GPU(s), health pass")


def test_dcgm_check_fails_when_the_health_check_is_refused(
    fake_dcgms: dict[int, Path], tmp_path: Path
) -> None:
    (tmp_path / "dcgm.txt").write_text(DCGM_SCENARIO + "fail dcgmHealthCheck -12\n")
    env = {
        **_bin_without_nvidia_smi(tmp_path),
        "LD_LIBRARY_PATH": str(fake_dcgms[4].parent),
        "DENPEX_FAKE_DCGM_SCENARIO": str(tmp_path / "dcgm.txt"),
    }
    done = _one("dcgm", env)
    assert done.returncode == 1 and "DCGM_ST_VER_MISMATCH" in done.stdout, done.stdout


@pytest.mark.skipif(
    ctypes.util.find_library("dcgm") is not None, reason="a real libdcgm is installed here"
)
def test_dcgm_check_skips_without_libdcgm(tmp_path: Path) -> None:
    done = _one("dcgm", {**_bin_without_nvidia_smi(tmp_path), "LD_LIBRARY_PATH": ""})
    assert done.returncode == 2 and done.stdout.startswith("SKIP dcgm: libdcgm not installed")


def test_board_serial_check_passes_where_nvml_and_nvidia_smi_agree(
    nvml_env: dict[str, str], tmp_path: Path
) -> None:
    serial = "1650000000000"  # the fake's serial of GPU 0 (scenario.identity)
    (tmp_path / "bin" / "nvidia-smi").write_text(f'#!/bin/sh\necho "00000000:18:00.0, {serial}"\n')
    done = _one("report-board-serials", nvml_env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("PASS report-board-serials: 1 GPU(s), 1 with a board serial")
    (tmp_path / "bin" / "nvidia-smi").write_text('#!/bin/sh\necho "00000000:18:00.0, 99"\n')
    done = _one("report-board-serials", nvml_env)
    assert done.returncode == 1 and "NVML gave serials" in done.stdout, done.stdout


def test_keras_check_skips_where_tensorflow_sees_no_gpu(tmp_path: Path) -> None:
    # never imported in the suite's process: tests/sdk/children/tensorflow_cases.py says why
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("needs TensorFlow: pip install tensorflow-cpu")
    env = {**_bin_without_nvidia_smi(tmp_path), "CUDA_VISIBLE_DEVICES": ""}
    done = _one("keras-fit-gpu", env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.startswith("SKIP keras-fit-gpu: TensorFlow") and "sees no GPU" in done.stdout
