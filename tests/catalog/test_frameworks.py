"""Signatures of the frameworks beyond PyTorch (JAX/XLA, TPU, TensorFlow/Keras, DeepSpeed,
Horovod, submitit/Lightning, Kubernetes, Gloo): each failure line lands in its taxonomy id with
the rank or host it names, and the noise these frameworks print on healthy runs stays below
failure severity."""

from __future__ import annotations

import pytest

from denpex.catalog import load_catalog

# the matcher, line splitter and ring buffer, compiled and pure Python (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("both_backends")

FAILURES = [
    # (line, category, captures that must be present)
    (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying"
        " to allocate 4770354232 bytes.",
        "cuda.oom",
        {"size": "4770354232"},
    ),
    (
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error."
        " Ran out of memory in memory space hbm. Used 63.80G of 30.75G hbm. Exceeded hbm capacity"
        " by 33.05G.",
        "cuda.oom",
        {"used": "63.80G", "capacity": "30.75G"},
    ),
    (
        "UNAVAILABLE: Task /job:jax_worker/replica:0/task:3 heartbeat timeout. This indicates that"
        " the remote task has failed, got preempted, or crashed unexpectedly.",
        "dist.peer_failure",
        {"rank": "3", "job": "jax_worker"},
    ),
    ("/job:jax_worker/replica:0/task:7", "dist.peer_failure", {"rank": "7"}),
    (
        "jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id:"
        " PjRT_Client_Connect. Timed out task names:",
        "dist.rendezvous_timeout",
        {"barrier": "PjRT_Client_Connect"},
    ),
    (
        "RuntimeError: Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by"
        " process with pid 27846. Not attempting to load libtpu.so in this process.",
        "gpu.driver_mismatch",
        {"holder_pid": "27846"},
    ),
    (
        "ResourceExhaustedError: OOM when allocating tensor with shape[128,128,109,109] and type"
        " float on /job:localhost/replica:0/task:0/device:GPU:1 by allocator GPU_1_bfc",
        "cuda.oom",
        {"gpu": "1"},
    ),
    ("Batch 1183: Invalid loss, terminating training", "train.nan_loss", {"batch": "1183"}),
    (
        "DEADLINE_EXCEEDED: Collective has timed out waiting for other workers.",
        "nccl.timeout",
        {"phase": "waiting for other workers"},
    ),
    (
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out"
        " waiting 1800000ms for recv operation to complete",
        "nccl.timeout",
        {"op": "recv", "timeout_ms": "1800000"},
    ),
    (
        "[2024-03-01 10:11:12,345] [ERROR] [launch.py:321:sigkill_handler] ['/usr/bin/python',"
        " '-u', 'train.py', '--local_rank=3', '--deepspeed', 'ds.json'] exits with return code = -9",
        "host.oom_killed",
        {"local_rank": "3"},
    ),
    (
        "mpirun noticed that process rank 7 with PID 0 on node gpu-b-04 exited on signal 9"
        " (Killed).",
        "host.oom_killed",
        {"rank": "7", "host": "gpu-b-04"},
    ),
    ("  Process name: [[29973,1],5]", "dist.peer_failure", {"rank": "5"}),
    ("[1,0]<stderr>:3!: [allreduce.fc1.weight, allreduce.fc1.bias]", "train.hang", {"rank": "3"}),
    (
        "ZeRORuntimeException: The checkpoint being loaded used a DP world size of 8 but the"
        " current world size is 16. Automatic adjustment of ZeRO's optimizer state partitioning"
        " with a new world size is not currently supported.",
        "ckpt.load_failure",
        {"saved": "8", "current": "16"},
    ),
    (
        "AssertionError: tensor_model_parallel_size value from checkpoint (2) is not equal to the"
        " input argument value (4).",
        "ckpt.load_failure",
        {"arg": "tensor_model_parallel_size", "saved": "2", "current": "4"},
    ),
    (
        "submitit WARNING (2024-02-11 04:12:55,101) - Caught signal SIGUSR2 on gpu-a-17: this job"
        " is timed-out.",
        "job.time_limit",
        {"signal": "SIGUSR2", "host": "gpu-a-17"},
    ),
    (
        "  Normal   PyTorchJobFailed     9s    pytorchjob-controller  PyTorchJob llm-sft is failed"
        " because 1 Worker replica(s) failed.",
        "dist.peer_failure",
        {"kind": "PyTorchJob", "job": "llm-sft", "replica": "Worker"},
    ),
    (
        "  Message:          The node was low on resource: ephemeral-storage. Threshold quantity:"
        " 10Gi, available: 9123456Ki.",
        "host.disk_full",
        {},
    ),
]

# healthy output of these frameworks, taken from real runs: nothing here is a failure
HEALTHY_NOISE = [
    "2021-03-01 10:00:00.000000: W tensorflow/stream_executor/platform/default/dso_loader.cc:64]"
    " Could not load dynamic library 'libcudart.so.11.0'; dlerror: libcudart.so.11.0: cannot open"
    " shared object file: No such file or directory",
    "2021-03-01 10:00:00.000000: I tensorflow/stream_executor/cuda/cudart_stub.cc:29] Ignore above"
    " cudart dlerror if you do not have a GPU set up on your machine.",
    "WARNING:absl:No GPU/TPU found, falling back to CPU. (Set TF_CPP_MIN_LOG_LEVEL=0 and rerun for"
    " more info.)",
    "I0223 22:58:05.579842 140312230876992 xla_bridge.py:660] Unable to initialize backend 'tpu':"
    " INTERNAL: Failed to open libtpu.so: libtpu.so: cannot open shared object file: No such file"
    " or directory",
    "2025-05-18 21:59:55.086788: W external/xla/xla/tsl/framework/bfc_allocator.cc:310] Allocator"
    " (GPU_0_bfc) ran out of memory trying to allocate 3.37GiB with freed_by_count=0. The caller"
    " indicates that this is not a failure, but this may mean that there could be performance"
    " gains if more memory were available.",
    "[0]<stdout>:[2024-03-01 10:00:01.000000: I /opt/horovod/horovod/common/timeline.cc:116]"
    " Opened new timeline file/tmp/timeline.json Set active and healthy to true",
    "INFO:lightning.pytorch.trainer.connectors.signal_connector:SLURM auto-requeueing enabled."
    " Setting signal handlers.",
    "I0301 04:00:00.000000 1842 coordination_service.cc:687] /job:jax_worker/replica:0/task:1 has"
    " disconnected from coordination service.",
]


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.mark.parametrize("line,category,captures", FAILURES, ids=[f[1] for f in FAILURES])
def test_a_framework_failure_lands_in_its_category_with_what_it_names(
    catalog, line, category, captures
):
    matches = [m for m in catalog.match_lines([line.encode()]) if m.signature.category == category]
    assert matches, f"no {category} signature matches {line!r}"
    found = {}
    for match in matches:
        found.update(match.signature.captures(line.encode()))
    assert captures.items() <= found.items()


@pytest.mark.parametrize("line", HEALTHY_NOISE)
def test_healthy_framework_noise_stays_below_failure_severity(catalog, line):
    loud = [
        m.signature.id
        for m in catalog.match_lines([line.encode()])
        if m.signature.severity in ("error", "critical")
    ]
    assert loud == []


def test_every_accelerator_neutral_id_says_which_id_it_maps_to(catalog):
    """A TPU or XLA failure filed under a CUDA- or GPU-named id must say why in its explain."""
    for sig in catalog.signatures:
        text = f"{sig.regex} {sig.id}".lower()
        # XLA's own allocator serves GPU, ROCm and TPU alike; cuDNN and CUDA messages do not
        neutral = "tpu" in text or "hbm" in text or ("xla" in sig.id and sig.category == "cuda.oom")
        if neutral and sig.category.startswith(("cuda.", "gpu.")):
            assert sig.category in sig.explain or "taxonomy" in sig.explain, sig.id
