"""The log and kernel lines the fleet simulator (fleet_sim.py) writes, per failure category.

Real error strings (NVIDIA Xid messages, PyTorch / NCCL errors, Slurm's cancel banner, EDAC,
mlx5), formatted with the rank, host and job; `check_lines` proves that the real catalog
reads each as the category the simulator means, so the benchmark never scores a fault the
scanner could not have seen.
"""

from __future__ import annotations

from denpex.catalog import Catalog

# a job's own output: the failing rank's lines, in order ({rank}, {host}, {job})
JOB_LINES: dict[str, tuple[str, ...]] = {
    "app.exception": (
        "[rank{rank}]: Traceback (most recent call last):",
        "[rank{rank}]: RuntimeError: shape '[8, 1024, 32, 128]' is invalid for input of size 33554431",
    ),
    "host.segfault": ("[rank{rank}]: *** SIGSEGV received at time=1798761600 on cpu 6 ***",),
    "cuda.illegal_address": (
        "[rank{rank}]: RuntimeError: CUDA error: an illegal memory access was encountered",
    ),
    "cuda.oom": (
        "[rank{rank}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 0 has a total capacity of 79.15 GiB of which 1.23 GiB is free.",
    ),
    "env.import_error": (
        "ImportError: cannot import name 'LlamaConfig' from 'transformers' "
        "(/usr/lib/python3/dist-packages/transformers/__init__.py)",
    ),
    "env.config_error": ("train.py: error: argument --lr: invalid float value: '3e-4,'",),
    "train.nan_loss": (
        "[rank{rank}]: FloatingPointError: Loss became infinite or NaN at iteration=4521!",
    ),
    "data.corrupt_input": (
        "[rank{rank}]: zlib.error: Error -5 while decompressing data: incomplete or truncated stream",
    ),
    "ckpt.load_failure": (
        "[rank{rank}]: RuntimeError: Missing key in checkpoint state_dict: model.embeddings.weight.",
    ),
    "job.time_limit": (
        "slurmstepd: error: *** JOB {job} ON {host} CANCELLED AT 2027-01-01T00:00:00 DUE TO TIME LIMIT ***",
    ),
    "job.preempted": (
        "slurmstepd: error: *** JOB {job} ON {host} CANCELLED AT 2027-01-01T00:00:00 DUE TO PREEMPTION ***",
    ),
    "net.ib_error": (
        "[rank{rank}]: {host}:4100:4188 [3] transport/net_ib.cc:1296 NCCL WARN NET/IB : Got completion "
        "from peer 10.2.0.5<33092> with error 12, opcode 0, len 0, vendor err 129",
        "[rank{rank}]: torch.distributed.DistBackendError: NCCL error in: "
        "../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or there "
        "was a network error, NCCL version 2.21.5",
    ),
    "gpu.ecc_uncorrectable": (
        "[rank{rank}]: RuntimeError: CUDA error: uncorrectable ECC error encountered",
    ),
    "xid79": ("[rank{rank}]: RuntimeError: CUDA error: unspecified launch failure",),
    "gpu.gsp_timeout": (
        "[rank{rank}]: RuntimeError: CUDA error: the launch timed out and was terminated",
    ),
    "cuda.launch_failure": (
        "[rank{rank}]: RuntimeError: CUDA error: an illegal instruction was encountered",
    ),
    "watchdog": (
        "[rank{rank}]: [Rank {rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1200, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600021 milliseconds before timing out.",
    ),
}

# kernel-log lines an agent reads ({pci} of the GPU or NIC)
AGENT_LINES: dict[str, str] = {
    "xid48": "NVRM: Xid (PCI:{pci}): 48, pid=41233, name=python, An uncorrectable double bit error "
    "(DBE) has been detected on GPU in the framebuffer at partition 0, subpartition 0.",
    "xid94": "NVRM: Xid (PCI:{pci}): 94, pid=41233, name=python, Contained: SM (0x1). RST: No, D-RST: No",
    "xid79": "NVRM: Xid (PCI:{pci}): 79, pid=41233, GPU has fallen off the bus.",
    "xid63": "NVRM: Xid (PCI:{pci}): 63, pid=41233, Row Remapper: New row marked for remapping, "
    "reboot gpu to activate.",
    "xid119": "NVRM: Xid (PCI:{pci}): 119, pid=41233, name=python, Timeout after 6s of waiting for "
    "RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20800a4c 0x4).",
    "edac": "EDAC MC0: 1 CE memory read error on CPU_SrcID#0_Ha#0_Chan#1_DIMM#0 (channel:1 slot:0 "
    "page:0x12345 offset:0x0 grain:32 syndrome:0x0)",
    "mlx_link_down": "mlx5_core {pci}.0 enp59s0f0np0: Link down",
}

JOB_EXPECT = {
    "xid79": "cuda.launch_failure",
    "gpu.gsp_timeout": "cuda.launch_failure",  # the Xid 119 is in the kernel log only
    "watchdog": "nccl.timeout",
}
AGENT_EXPECT = {
    "xid48": "gpu.ecc_uncorrectable",
    "xid94": "gpu.ecc_uncorrectable",
    "xid79": "gpu.fallen_off_bus",
    "xid63": "gpu.row_remap",
    "xid119": "gpu.gsp_timeout",
    "edac": "host.kernel_fault",
    "mlx_link_down": "net.link_down",
}


def _categories(catalog: Catalog, line: str) -> set[str]:
    return {m.signature.category for m in catalog.match_lines([line.encode()])}


def check_lines(catalog: Catalog) -> None:
    """Raises if the catalog no longer reads a line as the category the simulator means."""
    wrong = []
    for name, lines in JOB_LINES.items():
        want = JOB_EXPECT.get(name, name)
        texts = [line.format(rank=3, host="gpu-node-001", job="1") for line in lines]
        found = set().union(*(_categories(catalog, text) for text in texts))
        if want not in found:
            text = " / ".join(texts)
            wrong.append(f"{name}: {text!r} is not read as {want}")
    for name, line in AGENT_LINES.items():
        text = line.format(pci="0000:3b:00")
        if AGENT_EXPECT[name] not in _categories(catalog, text):
            wrong.append(f"{name}: {text!r} is not read as {AGENT_EXPECT[name]}")
    if wrong:
        raise SystemExit(
            "fleet simulator lines the catalog reads differently:\n" + "\n".join(wrong)
        )
