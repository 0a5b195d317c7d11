"""The CUPTI tracer against a fake libcupti with CUPTI 12's ABI (tests/fakes/cupti): kernel
records and launch callbacks become per-step GPU time and in-flight NCCL kernels; CUPTI's
refusals (old version, another subscriber, a kind it cannot trace, no driver) stop it at
start with a reason; dx.watch loads it only when asked."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from denpex.core.events import Event
from denpex.sdk.cupti import CuptiFeed, CuptiTracer, CuptiUnavailable, KernelRecord

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "fakes" / "cupti" / "fake_cupti.c"
NCCL = b"ncclDevKernel_AllReduce_Sum_f32_RING_LL"
MS = 1_000_000


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not shutil.which("gcc"):
        pytest.skip("needs gcc to build the fake libcupti")
    out = tmp_path_factory.mktemp("fake_cupti") / "libcupti.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", "-Wall", "-o", str(out), str(SOURCE)], check=True
    )
    return out


@pytest.fixture
def library(built: Path, tmp_path: Path) -> Path:
    """A copy of its own per test: the fake keeps CUPTI's process-wide state (one
    subscriber), and another path is another instance."""
    copy = tmp_path / "libcupti.so.12"
    shutil.copy(built, copy)
    return copy


def driver(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    lib.fake_cupti_launch.restype = ctypes.c_uint32
    lib.fake_cupti_launch.argtypes = [
        ctypes.c_char_p,
        ctypes.c_uint32,
        ctypes.c_uint32,
        ctypes.c_int,
    ]
    lib.fake_cupti_finish.argtypes = [ctypes.c_uint32, ctypes.c_uint64]
    lib.fake_cupti_advance_ns.argtypes = [ctypes.c_uint64]
    lib.fake_cupti_name_offset.restype = ctypes.c_size_t
    return lib


def test_kernel_record_prefix_matches_the_header_layout(library: Path) -> None:
    lib = driver(library)
    assert KernelRecord.name.offset == lib.fake_cupti_name_offset() == 104
    assert (KernelRecord.start.offset, KernelRecord.correlationId.offset) == (16, 92)


def test_kernel_durations_per_step_with_nccl_apart(library: Path) -> None:
    lib = driver(library)
    tracer = CuptiTracer(str(library))
    try:
        assert tracer.api_version == 24
        tracer.mark_step(0)
        gemm = lib.fake_cupti_launch(b"ampere_sgemm_128x64_nn", 0, 7, 0)
        relu = lib.fake_cupti_launch(b"vectorized_elementwise_kernel", 0, 7, 0)
        allreduce = lib.fake_cupti_launch(NCCL, 0, 9, 1)
        assert lib.fake_cupti_finish(gemm, 3 * MS) == 0
        assert lib.fake_cupti_finish(relu, 1 * MS) == 0
        assert lib.fake_cupti_finish(allreduce, 5 * MS) == 0
        lib.fake_cupti_advance_ns(20 * MS)
        tracer.mark_step(1)
        (step,) = tracer.steps()
        assert (step.step, step.kernels) == (0, 3)
        assert step.compute_s == pytest.approx(0.004) and step.nccl_s == pytest.approx(0.005)
        assert (tracer.kernels, tracer.nccl_kernels, tracer.dropped) == (3, 1, 0)
        assert CuptiFeed(tracer, 10.0).step_busy_s() == pytest.approx(0.004)
        lib.fake_cupti_advance_ns(20 * MS)
        tracer.mark_step(2)  # a step without kernels says nothing about busy time
        assert tracer.steps()[-1].kernels == 0 and CuptiFeed(tracer, 10.0).step_busy_s() is None
    finally:
        tracer.close()


def test_an_nccl_kernel_that_never_finishes_places_the_rank_in_a_collective(
    library: Path,
) -> None:
    lib = driver(library)
    tracer = CuptiTracer(str(library))
    try:
        feed = CuptiFeed(tracer, in_flight_after_s=0.0)
        lib.fake_cupti_launch(b"ampere_sgemm_128x64_nn", 0, 7, 0)  # unfinished, not NCCL
        assert feed.place() is None
        stuck = lib.fake_cupti_launch(NCCL, 0, 9, 1)
        where, frame = feed.place() or ("", "")
        assert where == "collective" and NCCL.decode() in frame and "in flight" in frame
        assert CuptiFeed(tracer, in_flight_after_s=3600).place() is None  # not long enough
        lib.fake_cupti_finish(stuck, 2 * MS)
        assert feed.place() is None  # finished and flushed: no longer in flight
    finally:
        tracer.close()


def test_the_progress_monitor_reads_the_gpu_place_and_busy_time(library: Path) -> None:
    from denpex.sdk.progress import ProgressMonitor

    lib = driver(library)
    tracer = CuptiTracer(str(library))
    monitor = ProgressMonitor(
        rank=0, world_size=1, emit=lambda _: None, host="h",
        options={"watchdog_interval_s": 60}, gpu=CuptiFeed(tracer, 0.0),
    )  # fmt: skip
    try:
        tracer.mark_step(0)
        lib.fake_cupti_finish(lib.fake_cupti_launch(b"ampere_sgemm_128x64_nn", 0, 7, 0), 7 * MS)
        lib.fake_cupti_advance_ns(10 * MS)
        tracer.mark_step(1)
        monitor.on_step(1, 1.0, None)
        assert list(monitor._busy) == [pytest.approx(0.007)]  # GPU time, not the wall time
        assert monitor._own_record()["where"] != "collective"
        lib.fake_cupti_launch(NCCL, 0, 9, 1)
        record = monitor._own_record()
        assert record["where"] == "collective" and NCCL.decode() in record["frame"]
    finally:
        monitor.close()
        tracer.close()


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"FAKE_CUPTI_API_VERSION": "12"}, "API version 12 is older than 13"),
        ({"FAKE_CUPTI_BUSY": "1"}, "another tool holds CUPTI"),
        (
            {"FAKE_CUPTI_INCOMPATIBLE": "3,10"},
            "CONCURRENT_KERNEL) failed with CUPTI_ERROR_NOT_COMPATIBLE",
        ),
        ({"FAKE_CUPTI_NOT_INITIALIZED": "1"}, "CUPTI_ERROR_NOT_INITIALIZED"),
    ],
)
def test_cupti_saying_no_stops_the_tracer_with_a_reason(
    library: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], said: str
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(CuptiUnavailable, match=said.replace("(", r"\(").replace(")", r"\)")):
        CuptiTracer(str(library))
    for name in env:
        monkeypatch.delenv(name)
    CuptiTracer(str(library)).close()  # a refused start left no subscriber behind


def test_a_missing_library_is_unavailable_not_a_crash(tmp_path: Path) -> None:
    with pytest.raises(CuptiUnavailable, match="libcupti not found"):
        CuptiTracer(str(tmp_path / "libcupti.so"))


def test_watch_loads_cupti_only_when_asked(library: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import denpex.sdk as dx

    monkeypatch.setenv("DENPEX_CUPTI_LIBRARY", str(library))
    monkeypatch.delenv("DENPEX_CUPTI", raising=False)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    off = dx.watch(model, optimizer, emit=lambda _: None, progress=False)
    assert off.cupti is None
    off.close()
    monkeypatch.setenv("DENPEX_CUPTI", "1")
    on = dx.watch(model, optimizer, emit=lambda _: None, progress=False)
    try:
        assert isinstance(on.cupti, CuptiTracer)
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()
            on.step()
        assert len(on.cupti.steps()) == 2  # three marks: two whole steps between them
    finally:
        on.close()
    monkeypatch.setenv("FAKE_CUPTI_BUSY", "1")
    got: list = []
    refused = dx.watch(model, optimizer, cupti=True, emit=got.append, progress=False)
    refused.close()
    assert refused.cupti is None
    lost = [e for e in got if isinstance(e, Event) and e.attrs.get("check") == "cupti"]
    assert len(lost) == 1 and "another tool holds CUPTI" in lost[0].attrs["reason"]
