"""Retrieval for summaries: a local embedding model, the runbook and past-incident indexes,
and the block of nearest entries printed under a diagnosis (DESIGN §9).

Sits just above `denpex.diagnosis` so that both Layer 0 (`denpex.lite`) and the control plane
use it. It never changes a diagnosis: it only adds cited passages below the deterministic
summary, and every heavy dependency (onnxruntime, tokenizers, numpy) is imported lazily.
"""
