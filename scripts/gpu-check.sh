#!/usr/bin/env bash
# The one command that runs every check denpex needs a real NVIDIA GPU for: NVML against the
# real driver (no shim), DCGM when it is installed, the SDK's CUDA paths (NaN hook, checksums
# of CUDA tensors, canary), CUPTI through dx.watch when it exists, and a real CUDA OOM and
# illegal-address job under `denpex run`, the board serials of the job report, and a Keras
# fit on the GPU (with a CUDA build of TensorFlow). One PASS/FAIL/SKIP line per check, in under 8
# minutes; exit 1 on any FAIL. Without a GPU it says so, prints every check SKIP and exits 0
# (what CI sees). The checks are scripts/gpu_check.py.
# Usage: bash scripts/gpu-check.sh        (PYTHON=... picks the interpreter, default python3)
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

no_gpu() {
    echo "gpu-check: no NVIDIA GPU here ($1): every check SKIP"
    exec "$PYTHON" scripts/gpu_check.py --no-gpu "no NVIDIA GPU ($1)"
}

if ! command -v nvidia-smi >/dev/null 2>&1; then
    no_gpu "nvidia-smi not found"
fi
# nvidia-smi -L lists "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)"; it exits non-zero
# (9: the driver cannot be reached) where no driver runs
if ! listing=$(timeout 30 nvidia-smi -L 2>&1); then
    no_gpu "nvidia-smi -L failed: $(head -n 1 <<<"$listing")"
fi
if ! grep -q '^GPU [0-9]' <<<"$listing"; then
    no_gpu "nvidia-smi -L lists no GPU"
fi
echo "gpu-check: $(grep -c '^GPU [0-9]' <<<"$listing") GPU(s): $(grep -m1 '^GPU 0' <<<"$listing")"
exec "$PYTHON" scripts/gpu_check.py
