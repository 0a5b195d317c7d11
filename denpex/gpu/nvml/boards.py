"""The board identity of each NVIDIA GPU on this host, by PCI bus id: the serial number
(nvmlDeviceGetSerial, which follows the board from host to host), UUID and VBIOS, read once
through NVML on a thread of its own, for `denpex run`'s job report.

Never blocks its caller longer than asked: a driver that hangs in NVML leaves the daemon
thread behind and the report without serials; never raises for an NVML failure.
"""

from __future__ import annotations

import logging
import threading
from types import ModuleType
from typing import Any

from denpex.core.collector import settings
from denpex.gpu.nvml.library import bind_library
from denpex.gpu.nvml.query import GpuGone, GpuReader, GpuUnreadable

log = logging.getLogger("denpex.gpu.boards")
IDENTITY_KEYS = ("serial", "uuid", "vbios")  # what a job report carries of each board


def read_boards(nvml: ModuleType) -> dict[str, dict[str, str]]:
    """PCI bus id (NVML's, "00000000:3B:00.0") → {serial, uuid, vbios} (those the GPU
    answered) of every GPU NVML lists; a GPU that cannot be read is left out."""
    nvml.nvmlInit()
    try:
        boards: dict[str, dict[str, str]] = {}
        for index in range(int(nvml.nvmlDeviceGetCount())):
            try:
                identity = GpuReader(nvml, index).read_identity()
            except (GpuGone, GpuUnreadable) as exc:
                log.debug("boards: GPU %d not read: %s", index, exc)
                continue
            if identity.get("pci_bus_id"):
                boards[identity["pci_bus_id"]] = {
                    key: identity[key] for key in IDENTITY_KEYS if identity.get(key)
                }
        return boards
    finally:
        nvml.nvmlShutdown()


class BoardLookup:
    """`read_boards` started now on a daemon thread; `result(wait_s)` is what it found by
    then ({} and `problem` set when NVML failed or has not answered)."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self.boards: dict[str, dict[str, str]] = {}
        self.problem: str | None = None
        self._done = threading.Event()
        self._nvml = nvml
        threading.Thread(target=self._look, name="denpex-gpu-boards", daemon=True).start()

    def _look(self) -> None:
        try:
            nvml = self._nvml if self._nvml is not None else _pynvml()
            self.boards = read_boards(nvml)
        except Exception as exc:  # no pynvml, no driver, a shim without a scenario, …
            self.problem = f"GPU serials not read: {exc}"
        finally:
            self._done.set()

    def result(self, wait_s: float | None = None) -> dict[str, dict[str, str]]:
        if wait_s is None:
            wait_s = float(settings("denpex.gpu:settings.yaml", "boards")["report_wait_s"])
        if not self._done.wait(wait_s):
            self.problem = f"GPU serials not read: NVML did not answer within {wait_s:g} s"
            return {}
        return dict(self.boards)


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise ImportError("pynvml is not installed: pip install nvidia-ml-py") from exc
    bind_library(pynvml)  # ShimError when the shim is asked for and cannot be had
    return pynvml
