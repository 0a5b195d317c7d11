"""Ready-made ways to attach denpex to training frameworks: `hf` (Hugging Face Trainer),
`lightning` (PyTorch Lightning), `distributed` (DDP, FSDP, DeepSpeed engines), `megatron`
(Megatron-Core), `jax` and `tensorflow` (a Keras callback, tf.distribute worker places).

Each module imports its framework when it is imported, never before: import the one you use.
"""
