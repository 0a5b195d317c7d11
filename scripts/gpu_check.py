#!/usr/bin/env python3
"""The checks of scripts/gpu-check.sh: what denpex does on a real NVIDIA GPU that no fake can
show. Each check runs in a subprocess of its own (a CUDA fault or a hung driver call ends that
check alone, under its time limit) and prints one line, PASS, FAIL or SKIP with the reason.

    python scripts/gpu_check.py                 # every check (what gpu-check.sh runs)
    python scripts/gpu_check.py --no-gpu WHY    # every line SKIP, exit 0
    python scripts/gpu_check.py --one NAME      # one check, in this process

Exit status 1 when any check failed, else 0. It writes nothing but temporary files, never
loads denpex's NVML shim (the real libnvidia-ml.so.1 only), and never resets a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 450.0  # all checks together: gpu-check.sh must finish in under 8 minutes


class Skip(Exception):
    """The check cannot run here (no DCGM, torch without CUDA); the message says why."""


class Fail(Exception):
    """The check ran and what the GPU did is not what denpex expects."""


def _torch_cuda():
    try:
        import torch
    except ImportError as exc:
        raise Skip(f"torch is not installed ({exc})") from exc
    if torch.version.cuda is None:
        raise Skip(f"torch {torch.__version__} is built without CUDA")
    if not torch.cuda.is_available():
        raise Fail(f"torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU")
    return torch


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- the checks ------------------------------------------------------------------------------
def check_nvml() -> str:
    """pynvml on the real driver agrees with nvidia-smi, and one poll of the NVML collector
    exports every GPU under dcgm-exporter's labels, with no lost-GPU evidence."""
    os.environ.pop("DENPEX_NVML_SHIM", None)
    import pynvml

    from denpex.core.collector import CollectContext
    from denpex.core.events import Evidence
    from denpex.core.roots import Roots
    from denpex.gpu.nvml.collector import NvmlCollector

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        uuids = {_text(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)))
                 for i in range(count)}  # fmt: skip
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
    finally:
        pynvml.nvmlShutdown()
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid,driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    rows = [[c.strip() for c in line.split(",")] for line in smi.splitlines() if line.strip()]
    if {r[0] for r in rows} != uuids or {r[1] for r in rows} != {driver}:
        raise Fail(f"pynvml sees {sorted(uuids)} driver {driver}; nvidia-smi {rows}")
    collector = NvmlCollector(Roots(), {})
    try:
        ok, about = collector.available()
        if not ok:
            raise Fail(f"collector unavailable: {about}")
        found = collector.collect(CollectContext(Roots(), "gpu-check"))
        degraded = collector.degraded()
    finally:
        collector.close()
    lost = [e.signature for e in found if isinstance(e, Evidence)
            and e.category in ("gpu.fallen_off_bus", "gpu.reset_required")]  # fmt: skip
    temps = {e.attrs.get("UUID"): e.attrs for e in found
             if not isinstance(e, Evidence) and e.body == "DCGM_FI_DEV_GPU_TEMP"}  # fmt: skip
    if lost:
        raise Fail(f"a healthy GPU reported lost: {lost}")
    if set(temps) != uuids:
        raise Fail(f"DCGM_FI_DEV_GPU_TEMP for {sorted(temps)}, GPUs {sorted(uuids)}")
    for attrs in temps.values():
        if attrs.get("DCGM_FI_DRIVER_VERSION") != driver or attrs.get("device") != (
            f"nvidia{attrs.get('gpu')}"
        ):
            raise Fail(f"labels not dcgm-exporter's: {attrs}")
    return f"{count} GPU(s), driver {driver}; {about}" + (
        f"; degraded: {degraded}" if degraded else ""
    )


def check_dcgm() -> str:
    """An embedded DCGM host engine answers a health check with the response version its
    major version accepts, and the DCGM collector polls without going blind."""
    from denpex.core.collector import CollectContext
    from denpex.core.roots import Roots
    from denpex.gpu.dcgm.api import DcgmSession, load_library
    from denpex.gpu.dcgm.collector import DcgmCollector
    from denpex.gpu.dcgm.layouts import HEALTH_SYSTEMS

    try:
        lib = load_library(None)
    except OSError as exc:
        raise Skip(f"libdcgm not installed ({exc})") from exc
    session = DcgmSession(lib)
    try:
        gpus = session.gpu_ids()
        group = session.create_group("denpex-gpu-check", gpus)
        session.health_set(group, HEALTH_SYSTEMS["pcie"] | HEALTH_SYSTEMS["mem"])
        report = session.health_check(group)  # DcgmError (VER_MISMATCH) is a FAIL
    finally:
        session.close()
    collector = DcgmCollector(Roots(), {})
    try:
        collector.collect(CollectContext(Roots(), "gpu-check"))
        blind = collector.degraded()
    finally:
        collector.close()
    if blind:
        raise Fail(f"DCGM collector blind: {blind}")
    return f"DCGM {session.major}, {len(gpus)} GPU(s), health {report.overall}"


def _poisoned_model(torch):
    class Poison(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.on = False

        def forward(self, x):
            return x * float("nan") if self.on else x

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Linear(6, 16)
            self.middle = torch.nn.Sequential(torch.nn.Linear(16, 16), Poison(), torch.nn.GELU())
            self.head = torch.nn.Linear(16, 1)

        def forward(self, x):
            return self.head(self.middle(self.embed(x)))

    return Net().cuda()


def check_nan_hook() -> str:
    """dx.watch on a CUDA model names the module whose output went NaN first (the hooks'
    reductions are queued on the GPU, read back once the loss is not finite)."""
    torch = _torch_cuda()
    import denpex.sdk as dx

    torch.manual_seed(0)
    model = _poisoned_model(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    got: list = []
    guard = dx.watch(model, optimizer, every=10, emit=got.append, progress=False)
    for step in range(1, 31):
        model.middle[1].on = step >= 13
        x = torch.randn(8, 6, device="cuda")
        optimizer.zero_grad()
        loss = ((model(x) - 1.0) ** 2).mean()
        loss.backward()
        optimizer.step()
        guard.step(loss)
    guard.close()
    nans = [e for e in got if getattr(e, "category", None) == "train.nan_loss"]
    if len(nans) != 1 or nans[0].captures.get("module") != "middle.1":
        raise Fail(f"expected one train.nan_loss naming middle.1, got {[e.captures for e in nans]}")
    if nans[0].captures.get("step") != "13":
        raise Fail(f"NaN reported at step {nans[0].captures.get('step')}, not 13")
    return "train.nan_loss names middle.1 at step 13"


def check_checksums() -> str:
    """The digest of CUDA tensors (one device-to-host snapshot, in chunks above 256 MiB)
    equals the digest of the same bytes hashed on the CPU."""
    torch = _torch_cuda()
    from denpex.sdk.checksums import TensorSet, byte_view, digest_buffers

    torch.manual_seed(0)
    tensors = [
        ("small", torch.randn(17, device="cuda")),
        ("bf16", torch.randn(1024, 1024, device="cuda").to(torch.bfloat16)),
        ("transposed", torch.randn(512, 300, device="cuda").t()),  # not contiguous
        ("large", torch.randn(80 << 20, device="cuda")),  # 320 MiB: more than one chunk
    ]
    on_gpu = TensorSet.of(tensors).digest_now()
    on_cpu = digest_buffers([byte_view(t.detach().cpu().contiguous()) for _, t in tensors])
    if on_gpu != on_cpu:
        raise Fail(f"CUDA digests {on_gpu} differ from CPU digests {on_cpu}")
    return f"{len(tensors)} CUDA tensors hashed as their CPU copies"


def check_canary() -> str:
    """On CUDA the canary batch gives bit-identical output on unchanged weights (legitimate
    training raises nothing), and a weight written outside the optimizer is caught."""
    torch = _torch_cuda()
    import denpex.sdk as dx

    def run(perturb_at: int | None) -> list:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(6, 64), torch.nn.Tanh(), torch.nn.BatchNorm1d(64),
            torch.nn.Linear(64, 1),
        ).cuda()  # fmt: skip
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        got: list = []
        guard = dx.watch(
            model, optimizer, every=5, canary_batch=torch.randn(4, 6, device="cuda"),
            canary_every=5, emit=got.append, progress=False,
        )  # fmt: skip
        for step in range(1, 31):
            x = torch.randn(8, 6, device="cuda")
            optimizer.zero_grad()
            loss = ((model(x) - x[:, :1]) ** 2).mean()
            loss.backward()
            optimizer.step()
            guard.step(loss)
            if step == perturb_at:
                with torch.no_grad():
                    model[0].weight[1, 2] += 1e-4
        guard.close()
        return [e.signature for e in got if getattr(e, "category", None) == "train.sdc"]

    clean, perturbed = run(None), run(10)
    if clean:
        raise Fail(f"legitimate CUDA training reported {clean}")
    if perturbed != ["train.sdc.weights_changed_outside_optimizer"]:
        raise Fail(f"a weight written outside the optimizer gave {perturbed}")
    return "no false alarm; a write outside the optimizer is caught"


def check_cupti() -> str:
    """The CUPTI tracer on the real libcupti, through dx.watch(..., cupti=True) only: kernel
    records arrive with names and durations, per step, and nothing is left in flight."""
    from denpex.sdk.watch import KNOWN_OPTIONS

    if "cupti" not in KNOWN_OPTIONS:
        raise Skip("dx.watch has no cupti option in this build (the CUPTI tracer is not here)")
    torch = _torch_cuda()
    import denpex.sdk as dx

    model = torch.nn.Linear(64, 64).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    got: list = []
    guard = dx.watch(model, optimizer, cupti=True, emit=got.append, progress=False)
    tracer = guard.cupti
    if tracer is None:
        lost = [
            e.attrs.get("reason") for e in got if getattr(e, "attrs", {}).get("check") == "cupti"
        ]
        raise Fail(f"the tracer did not start: {lost}")
    for _ in range(5):
        optimizer.zero_grad()
        model(torch.randn(8, 64, device="cuda")).sum().backward()
        optimizer.step()
        torch.cuda.synchronize()
        guard.step()
    steps = tracer.steps()
    guard.close()
    if tracer.kernels == 0 or len(steps) != 4:
        raise Fail(f"{tracer.kernels} kernel record(s), {len(steps)} step(s) timed (want 4)")
    if not all(s.kernels > 0 and s.compute_s > 0 for s in steps):
        raise Fail(f"a step without kernel time: {steps}")
    return (
        f"CUPTI API {tracer.api_version}: {tracer.kernels} kernel(s) over 5 steps, "
        f"{steps[-1].compute_s * 1e6:.0f} us of GPU time in the last, {tracer.dropped} dropped"
    )


OOM_JOB = """
import torch
torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB: more than any GPU has
"""
# a real device pointer with a length 32 GiB past its allocation: the reduction reads
# unmapped device memory, an MMU fault the driver reports as cudaErrorIllegalAddress
ILLEGAL_ADDRESS_JOB = """
import torch
small = torch.zeros(1024, device="cuda")
torch.cuda.synchronize()
class PastTheEnd:
    __cuda_array_interface__ = {"shape": (1 << 33,), "typestr": "<f4", "strides": None,
                                "data": (small.data_ptr(), False), "version": 3}
print(float(torch.as_tensor(PastTheEnd(), device="cuda").sum()))
"""


def _diagnosed(job: str, expected: str) -> str:
    _torch_cuda()
    with tempfile.TemporaryDirectory(prefix="denpex-gpu-check-") as folder:
        report = Path(folder) / "report.json"
        done = subprocess.run(
            [sys.executable, "-m", "denpex", "run", "--no-pty", "-q", "--report", str(report),
             "--", sys.executable, "-c", job],
            capture_output=True, text=True, timeout=120, cwd=folder,
        )  # fmt: skip
        if done.returncode == 0:
            raise Fail(f"the job did not fail: {done.stdout[-300:]!r}")
        if not report.exists():
            raise Fail(f"denpex run wrote no report (exit {done.returncode}): {done.stderr[-300:]}")
        root = (json.loads(report.read_text()).get("root_cause") or {}).get("category")
    if root != expected:
        raise Fail(f"diagnosed {root}, not {expected}; the job said: {done.stderr[-400:]!r}")
    return f"denpex run diagnosed {root} (job exit {done.returncode})"


def check_run_oom() -> str:
    """A real CUDA out-of-memory under `denpex run` is diagnosed cuda.oom."""
    return _diagnosed(OOM_JOB, "cuda.oom")


def check_run_illegal_address() -> str:
    """A real illegal memory access under `denpex run` is diagnosed cuda.illegal_address."""
    return _diagnosed(ILLEGAL_ADDRESS_JOB, "cuda.illegal_address")


def check_board_serials() -> str:
    """The board serials `denpex run` puts in its job report (BoardLookup, through NVML) are
    those nvidia-smi prints for the same PCI bus ids."""
    os.environ.pop("DENPEX_NVML_SHIM", None)
    from denpex.gpu.nvml.boards import BoardLookup

    lookup = BoardLookup()
    boards = lookup.result(30.0)
    if lookup.problem:
        raise Fail(lookup.problem)
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=pci.bus_id,serial", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    expected = {}
    for line in smi.splitlines():
        bus_id, _, serial = (c.strip() for c in line.partition(","))
        if bus_id:
            expected[bus_id.upper()] = "" if serial.startswith("[") else serial  # [N/A]
    got = {bus_id.upper(): board.get("serial", "") for bus_id, board in boards.items()}
    if got != expected:
        raise Fail(f"NVML gave serials {got}; nvidia-smi {expected}")
    named = sum(1 for serial in got.values() if serial)
    return f"{len(got)} GPU(s), {named} with a board serial, as nvidia-smi prints them"


def check_keras_fit() -> str:
    """A Keras fit on the GPU, watched by the denpex callback: one train.nan_loss, at the
    step whose batch carries a NaN, and nothing for the steps before it."""
    try:
        import numpy as np
        import tensorflow as tf
    except ImportError as exc:
        raise Skip(f"TensorFlow is not installed ({exc})") from exc
    if not tf.config.list_physical_devices("GPU"):
        build = "CPU-only" if not tf.test.is_built_with_cuda() else "CUDA"
        raise Skip(f"TensorFlow {tf.__version__} ({build} build) sees no GPU")
    from denpex.sdk.integrations.tensorflow import DenpexCallback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = x @ np.arange(8, dtype="float32")
    x[5 * 8] = np.nan  # a sample of the sixth batch
    got: list = []
    with tf.device("/GPU:0"):
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                  callbacks=[DenpexCallback(emit=got.append, hang_floor_s=60)])  # fmt: skip
    device = model.layers[0].kernel.value.device
    if "GPU" not in device:
        raise Fail(f"the model's weights are on {device}, not a GPU")
    nans = [e for e in got if getattr(e, "category", None) == "train.nan_loss"]
    if len(nans) != 1 or nans[0].captures.get("step") != "6":
        raise Fail(f"expected one train.nan_loss at step 6, got {[e.captures for e in nans]}")
    return f"TensorFlow {tf.__version__} on {device}: train.nan_loss at step 6"


# name → (check, seconds it may take)
CHECKS: dict[str, tuple[Callable[[], str], float]] = {
    "nvml-real-driver": (check_nvml, 45),
    "dcgm": (check_dcgm, 45),
    "sdk-nan-hook-cuda": (check_nan_hook, 60),
    "sdk-checksums-cuda": (check_checksums, 60),
    "sdk-canary-cuda": (check_canary, 60),
    "cupti": (check_cupti, 45),
    "run-cuda-oom": (check_run_oom, 60),
    "run-cuda-illegal-address": (check_run_illegal_address, 60),
    "report-board-serials": (check_board_serials, 40),
    "keras-fit-gpu": (check_keras_fit, 90),
}


def run_one(name: str) -> int:
    """Run one check here and print its line: exit 0 PASS, 1 FAIL, 2 SKIP."""
    check, _ = CHECKS[name]
    try:
        detail = check()
    except Skip as exc:
        print(f"SKIP {name}: {exc}")
        return 2
    except Fail as exc:
        print(f"FAIL {name}: {exc}")
        return 1
    except Exception as exc:  # any error of a check is its FAIL, with what it was
        print(f"FAIL {name}: {type(exc).__name__}: {exc}")
        return 1
    print(f"PASS {name}: {detail}")
    return 0


def run_all() -> int:
    """Every check in a subprocess of its own, within the overall budget."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("DENPEX_NVML_SHIM", None)
    deadline = time.monotonic() + BUDGET_S
    failed = 0
    for name, (_, limit) in CHECKS.items():
        left = deadline - time.monotonic()
        if left < 5:
            print(f"FAIL {name}: not started, the {BUDGET_S:.0f} s budget is spent", flush=True)
            failed += 1
            continue
        try:
            done = subprocess.run(
                [sys.executable, __file__, "--one", name], env=env, capture_output=True,
                text=True, timeout=min(limit, left),
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            print(f"FAIL {name}: did not finish in {min(limit, left):.0f} s", flush=True)
            failed += 1
            continue
        lines = [
            line
            for line in done.stdout.splitlines()
            if line.startswith(("PASS ", "FAIL ", "SKIP "))
        ]
        if done.returncode not in (0, 1, 2) or not lines:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            print(f"FAIL {name}: exit {done.returncode}: {tail[0]}", flush=True)
            failed += 1
            continue
        print(lines[-1], flush=True)
        failed += done.returncode == 1
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--one", choices=sorted(CHECKS), help="run one check in this process")
    parser.add_argument("--no-gpu", metavar="WHY", help="print every check SKIP with WHY")
    args = parser.parse_args(argv)
    if args.no_gpu:
        for name in CHECKS:
            print(f"SKIP {name}: {args.no_gpu}")
        return 0
    if args.one:
        code = run_one(args.one)
        sys.stdout.flush()
        os._exit(code)  # a driver thread still waiting (an event set) must not hold the exit
    return run_all()


if __name__ == "__main__":
    sys.exit(main())
