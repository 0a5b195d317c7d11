"""Which libnvidia-ml pynvml talks to: the driver's, or the fake library built from a
scenario when DENPEX_NVML_SHIM=1 asks for it (a demo or a test, never on its own).

One place for this choice, shared by the NVML collector and the job report's board lookup.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from typing import Any

from denpex.gpu.nvml.scenario import FakeLibraryError, ScenarioError, prepare_shim

SHIM_ENV = "DENPEX_NVML_SHIM"
SHIM_SCENARIO_ENV = "DENPEX_NVML_SCENARIO"


class ShimError(Exception):
    """The shim was asked for and cannot be had (no scenario, a bad one, no compiler)."""


def bind_library(pynvml: Any, env: Mapping[str, str] | None = None) -> str:
    """Load the fake library into pynvml when the shim is asked for (before nvmlInit, which
    would load the driver's); what pynvml will talk to, in words."""
    env = os.environ if env is None else env
    if env.get(SHIM_ENV) != "1":
        return "NVML"
    scenario = env.get(SHIM_SCENARIO_ENV)
    if not scenario:
        raise ShimError(f"{SHIM_ENV}=1 needs {SHIM_SCENARIO_ENV}=FILE.yaml (a scenario)")
    try:
        library = prepare_shim(scenario)
    except (ScenarioError, FakeLibraryError) as exc:
        raise ShimError(f"NVML shim: {exc}") from exc
    with pynvml.libLoadLock:
        if pynvml.nvmlLib is None:
            pynvml.nvmlLib = ctypes.CDLL(str(library))
    return f"fake NVML (scenario {scenario})"
