"""An opt-in CUPTI tracer for the training process (`dx.watch(..., cupti=True)` or
DENPEX_CUPTI=1): kernel durations from CUPTI's activity buffers, and the NCCL kernels this
rank launched that have not finished, from its launch callbacks. The progress monitor reads
both: GPU time per step for stragglers, an NCCL kernel stuck in flight for hangs (a rank
whose GPU waits in a collective is waiting; the one whose GPU does not is the culprit).

Loaded only when asked; never raises into training: CUPTI saying no (another profiler holds
it, an old CUPTI, a kind it cannot trace) is CuptiUnavailable at start, with what to do.
Through ctypes only; the struct layouts are CUPTI 12.x's (cupti_activity.h, CUpti_ActivityKernel4
to 9 share the prefix read here).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

ENV_SWITCH = "DENPEX_CUPTI"
ENV_LIBRARY = "DENPEX_CUPTI_LIBRARY"
MIN_API_VERSION = 13  # CUDA 11.0 (cupti_version.h): the kernel record prefix below is stable
CUPTI_SUCCESS = 0
CUPTI_ERROR_MAX_LIMIT_REACHED = 12
CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39
KIND_KERNEL = 3
KIND_CONCURRENT_KERNEL = 10
DOMAIN_DRIVER_API = 1
DOMAIN_RUNTIME_API = 2
API_EXIT = 1
# the kernel launches of cupti_driver_cbid.h / cupti_runtime_cbid.h (CUDA 12.6): NCCL
# launches with cuLaunchKernelEx (or cudaLaunchKernelExC), PyTorch with cudaLaunchKernel
LAUNCH_CALLBACKS = (
    (DOMAIN_DRIVER_API, 307),  # cuLaunchKernel
    (DOMAIN_DRIVER_API, 442),  # cuLaunchKernel_ptsz
    (DOMAIN_DRIVER_API, 652),  # cuLaunchKernelEx
    (DOMAIN_DRIVER_API, 653),  # cuLaunchKernelEx_ptsz
    (DOMAIN_RUNTIME_API, 211),  # cudaLaunchKernel_v7000
    (DOMAIN_RUNTIME_API, 430),  # cudaLaunchKernelExC_v11060
)
NCCL_PREFIXES = (b"ncclKernel", b"ncclDevKernel")
BUFFER_BYTES = 1 << 20
ALIGN = 8  # CUPTI needs 8-byte aligned activity buffers


class CuptiUnavailable(RuntimeError):
    """CUPTI cannot trace here; the message says why and what would enable it."""


class KernelRecord(ctypes.Structure):
    """The prefix of CUpti_ActivityKernel4..9 up to `name` (packed, as CUPTI lays it out)."""

    _pack_ = 1
    _fields_ = [
        ("kind", ctypes.c_uint32),
        ("cacheConfig", ctypes.c_uint8),
        ("sharedMemoryConfig", ctypes.c_uint8),
        ("registersPerThread", ctypes.c_uint16),
        ("partitionedGlobalCacheRequested", ctypes.c_uint32),
        ("partitionedGlobalCacheExecuted", ctypes.c_uint32),
        ("start", ctypes.c_uint64),
        ("end", ctypes.c_uint64),
        ("completed", ctypes.c_uint64),
        ("deviceId", ctypes.c_uint32),
        ("contextId", ctypes.c_uint32),
        ("streamId", ctypes.c_uint32),
        ("grid", ctypes.c_int32 * 3),
        ("block", ctypes.c_int32 * 3),
        ("staticSharedMemory", ctypes.c_int32),
        ("dynamicSharedMemory", ctypes.c_int32),
        ("localMemoryPerThread", ctypes.c_uint32),
        ("localMemoryTotal", ctypes.c_uint32),
        ("correlationId", ctypes.c_uint32),
        ("gridId", ctypes.c_int64),
        ("name", ctypes.c_char_p),
    ]


class CallbackData(ctypes.Structure):
    """CUpti_CallbackData (cupti_callbacks.h)."""

    _fields_ = [
        ("callbackSite", ctypes.c_uint32),
        ("functionName", ctypes.c_char_p),
        ("functionParams", ctypes.c_void_p),
        ("functionReturnValue", ctypes.c_void_p),
        ("symbolName", ctypes.c_char_p),
        ("context", ctypes.c_void_p),
        ("contextUid", ctypes.c_uint32),
        ("correlationData", ctypes.c_void_p),
        ("correlationId", ctypes.c_uint32),
    ]


REQUEST = ctypes.CFUNCTYPE(
    None,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.POINTER(ctypes.c_size_t),
)
COMPLETE = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t
)
CALLBACK = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p
)


def requested() -> bool:
    """Whether DENPEX_CUPTI asks for the tracer (1, true, yes, on)."""
    return os.environ.get(ENV_SWITCH, "").strip().lower() in ("1", "true", "yes", "on")


def library_candidates() -> list[str]:
    """Where libcupti may be: DENPEX_CUPTI_LIBRARY, the CUDA toolkit, the nvidia-cuda-cupti
    wheel PyTorch installs, then the loader's own search."""
    found = [os.environ[ENV_LIBRARY]] if os.environ.get(ENV_LIBRARY) else []
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            found += sorted(
                glob.glob(os.path.join(home, "extras", "CUPTI", "lib64", "libcupti.so*"))
            )
    for path in sys.path:
        found += sorted(
            glob.glob(os.path.join(path, "nvidia", "cuda_cupti", "lib", "libcupti.so*"))
        )
    name = ctypes.util.find_library("cupti")
    if name:
        found.append(name)
    return found


def load_library(path: str | None = None) -> ctypes.CDLL:
    tried = [path] if path else library_candidates()
    errors = []
    for candidate in tried:
        try:
            return ctypes.CDLL(candidate)
        except OSError as exc:
            errors.append(f"{candidate}: {exc}")
    raise CuptiUnavailable(
        "libcupti not found (" + ("; ".join(errors) or "no candidate") + "): install the "
        "CUDA toolkit's CUPTI or the nvidia-cuda-cupti wheel, or set DENPEX_CUPTI_LIBRARY"
    )


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    start_ns: int
    end_ns: int
    device: int
    stream: int
    correlation: int

    @property
    def nccl(self) -> bool:
        return self.name.encode().startswith(NCCL_PREFIXES)

    @property
    def seconds(self) -> float:
        return max(0, self.end_ns - self.start_ns) / 1e9


@dataclass(frozen=True, slots=True)
class StepGpuTime:
    """GPU time of one step: kernels (NCCL's apart) that ended within it."""

    step: int
    compute_s: float
    nccl_s: float
    kernels: int


class CuptiTracer:
    """Kernel activity and in-flight NCCL kernels of this process, from CUPTI."""

    def __init__(self, library: ctypes.CDLL | str | None = None, *, keep_steps: int = 64) -> None:
        self._lib = library if isinstance(library, ctypes.CDLL) else load_library(library)
        self._lock = threading.Lock()
        self._buffers: dict[int, ctypes.Array[ctypes.c_char]] = {}
        self._in_flight: dict[int, tuple[str, float]] = {}  # correlation → (name, launched)
        self._ended: deque[Kernel] = deque(maxlen=65536)
        self._steps: deque[StepGpuTime] = deque(maxlen=keep_steps)
        self._boundary_ns: int | None = None
        self._step = 0
        self.kernels = 0
        self.nccl_kernels = 0
        self.dropped = 0
        self._subscriber = ctypes.c_void_p()
        # ctypes callbacks must outlive CUPTI's use of them
        self._request_cb = REQUEST(self._on_request)
        self._complete_cb = COMPLETE(self._on_complete)
        self._launch_cb = CALLBACK(self._on_launch)
        self._start()

    # --- set-up: every refusal is CuptiUnavailable -----------------------------------------
    def _call(self, what: str, result: int) -> None:
        if result == CUPTI_SUCCESS:
            return
        text = ctypes.c_char_p()
        self._lib.cuptiGetResultString(result, ctypes.byref(text))
        name = (text.value or b"").decode() or f"CUPTI error {result}"
        hint = ""
        if result == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
            hint = ": another tool holds CUPTI (Nsight, torch.profiler, an NVTX injection); run without it"
        raise CuptiUnavailable(f"{what} failed with {name}{hint}")

    def _start(self) -> None:
        version = ctypes.c_uint32()
        self._call("cuptiGetVersion", self._lib.cuptiGetVersion(ctypes.byref(version)))
        if version.value < MIN_API_VERSION:
            raise CuptiUnavailable(
                f"CUPTI API version {version.value} is older than {MIN_API_VERSION} (CUDA 11.0): "
                "update the CUDA toolkit's CUPTI"
            )
        self.api_version = version.value
        self._call(
            "cuptiSubscribe",
            self._lib.cuptiSubscribe(ctypes.byref(self._subscriber), self._launch_cb, None),
        )
        try:
            for domain, cbid in LAUNCH_CALLBACKS:
                self._call(
                    "cuptiEnableCallback",
                    self._lib.cuptiEnableCallback(1, self._subscriber, domain, cbid),
                )
            self._call(
                "cuptiActivityRegisterCallbacks",
                self._lib.cuptiActivityRegisterCallbacks(self._request_cb, self._complete_cb),
            )
            self._call(
                "cuptiActivityEnable(CONCURRENT_KERNEL)",
                self._lib.cuptiActivityEnable(KIND_CONCURRENT_KERNEL),
            )
        except CuptiUnavailable:
            self._lib.cuptiUnsubscribe(self._subscriber)
            raise

    # --- CUPTI's threads: record only -----------------------------------------------------
    def _on_request(self, buffer, size, max_records) -> None:  # type: ignore[no-untyped-def]
        block = ctypes.create_string_buffer(BUFFER_BYTES + ALIGN)
        address = ctypes.addressof(block)
        aligned = address + (-address % ALIGN)
        with self._lock:
            self._buffers[aligned] = block
        buffer[0] = aligned
        size[0] = BUFFER_BYTES
        max_records[0] = 0

    def _on_complete(self, _context, _stream, buffer, _size, valid) -> None:  # type: ignore[no-untyped-def]
        record = ctypes.c_void_p()
        found: list[Kernel] = []
        while (
            self._lib.cuptiActivityGetNextRecord(
                ctypes.c_void_p(buffer), ctypes.c_size_t(valid), ctypes.byref(record)
            )
            == CUPTI_SUCCESS
        ):
            kind = ctypes.c_uint32.from_address(record.value or 0).value
            if kind in (KIND_KERNEL, KIND_CONCURRENT_KERNEL):
                raw = KernelRecord.from_address(record.value or 0)
                name = (raw.name or b"?").decode("utf-8", "replace")
                found.append(
                    Kernel(name, raw.start, raw.end, raw.deviceId, raw.streamId, raw.correlationId)
                )
        dropped = ctypes.c_size_t()
        self._lib.cuptiActivityGetNumDroppedRecords(None, 0, ctypes.byref(dropped))
        with self._lock:
            self._buffers.pop(buffer, None)
            self.dropped += dropped.value
            for kernel in found:
                self.kernels += 1
                self._in_flight.pop(kernel.correlation, None)
                if kernel.nccl:
                    self.nccl_kernels += 1
                self._ended.append(kernel)

    def _on_launch(self, _userdata, _domain, _cbid, data) -> None:  # type: ignore[no-untyped-def]
        info = CallbackData.from_address(data)
        if info.callbackSite != API_EXIT or not (info.symbolName or b"").startswith(NCCL_PREFIXES):
            return
        with self._lock:
            if len(self._in_flight) < 65536:
                name = info.symbolName.decode("utf-8", "replace")
                self._in_flight[info.correlationId] = (name, time.monotonic())

    # --- the training thread and the watchdog ---------------------------------------------
    def flush(self) -> None:
        """Hand over what CUPTI has buffered (completed kernels); cheap when nothing is."""
        self._lib.cuptiActivityFlushAll(0)

    def mark_step(self, step: int) -> None:
        """A step ended: kernels that ended since the last mark are its GPU time."""
        now = ctypes.c_uint64()
        if self._lib.cuptiGetTimestamp(ctypes.byref(now)) != CUPTI_SUCCESS:
            return
        self.flush()
        with self._lock:
            if self._boundary_ns is not None:
                inside = [k for k in self._ended if self._boundary_ns < k.end_ns <= now.value]
                compute = sum(k.seconds for k in inside if not k.nccl)
                nccl = sum(k.seconds for k in inside if k.nccl)
                self._steps.append(StepGpuTime(self._step, compute, nccl, len(inside)))
            self._ended = deque((k for k in self._ended if k.end_ns > now.value), maxlen=65536)
            self._boundary_ns, self._step = now.value, step

    def steps(self) -> list[StepGpuTime]:
        with self._lock:
            return list(self._steps)

    def oldest_nccl_in_flight(self, now: float | None = None) -> tuple[str, float] | None:
        """(kernel name, seconds since launch) of the oldest NCCL kernel launched and not
        finished, after a flush; None when none is."""
        self.flush()
        now = time.monotonic() if now is None else now
        with self._lock:
            if not self._in_flight:
                return None
            name, launched = min(self._in_flight.values(), key=lambda item: item[1])
        return name, now - launched

    def close(self) -> None:
        try:
            self.flush()
            self._lib.cuptiActivityDisable(KIND_CONCURRENT_KERNEL)
            for domain, cbid in LAUNCH_CALLBACKS:
                self._lib.cuptiEnableCallback(0, self._subscriber, domain, cbid)
            self._lib.cuptiUnsubscribe(self._subscriber)
        except Exception:  # closing must never raise into training
            pass


class CuptiFeed:
    """What the progress monitor reads of the tracer (sdk/progress.py's GpuActivity)."""

    def __init__(self, tracer: CuptiTracer, in_flight_after_s: float) -> None:
        self.tracer = tracer
        self.in_flight_after_s = float(in_flight_after_s)

    def place(self) -> tuple[str, str] | None:
        """("collective", "gpu: <kernel> in flight N s") while an NCCL kernel of this rank has
        run longer than `in_flight_after_s`: the rank waits in a collective on its GPU even
        when its Python thread sits elsewhere (in .item(), a synchronize)."""
        oldest = self.tracer.oldest_nccl_in_flight()
        if oldest is None or oldest[1] < self.in_flight_after_s:
            return None
        return "collective", f"gpu: {oldest[0]} in flight {oldest[1]:.0f} s"

    def step_busy_s(self) -> float | None:
        """GPU compute time (kernels other than NCCL's) of the last step: this rank's own
        work, which waiting for peers does not inflate."""
        steps = self.tracer.steps()
        return steps[-1].compute_s if steps and steps[-1].kernels else None
