"""Ready-made ways to attach denpex to training frameworks: `hf` (Hugging Face Trainer),
`lightning` (PyTorch Lightning), `distributed` (DDP, FSDP, DeepSpeed engines) and `jax`.

Each module imports its framework when it is imported, never before: import the one you use.
"""
