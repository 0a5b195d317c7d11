"""XXH3-64 digests of a model's tensors (parameters, buffers, optimizer state), one per tensor.

CPU tensors are hashed in place through zero-copy byte views read through torch alone (no
numpy: torch does not require it); CUDA tensors go through one device-to-host copy of a
flattened snapshot. It never modifies a tensor and never copies a contiguous CPU tensor.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from denpex._native import load

# Above this many bytes the CUDA snapshot is taken in pieces, so the staging copy on the
# device never needs more than this much free memory.
CUDA_CHUNK_BYTES = 256 << 20


def byte_view(tensor: Any) -> memoryview:
    """A zero-copy view of a CPU tensor's bytes (any dtype), as a buffer the checksum module
    reads: the tensor's memory seen as `torch.uint8` elements, exposed through a ctypes
    array over it that holds a reference to the tensor (so the memory outlives the view)."""
    tensor = tensor.detach()
    if hasattr(tensor, "to_local"):  # a DTensor: the shard this rank holds
        tensor = tensor.to_local()
    flat = tensor.reshape(-1)  # a non-contiguous tensor is copied here
    if flat.numel() == 0:
        return memoryview(b"")
    if flat.device.type != "cpu":
        raise ValueError(f"byte_view needs a CPU tensor, not one on {flat.device}")
    raw = flat.view(_uint8())
    start, end = _bounds(raw)
    array = (ctypes.c_ubyte * (end - start)).from_address(start)
    array._denpex_tensor = raw  # type: ignore[attr-defined]  # keeps the memory alive
    return memoryview(array)


def _bounds(raw: Any) -> tuple[int, int]:
    """[start, end) addresses of a uint8 tensor's bytes, checked to lie inside its storage: a
    tensor subclass without real memory (data_ptr 0) must never be read through an address."""
    try:
        storage = raw.untyped_storage()
        base, size = storage.data_ptr(), storage.nbytes()
    except RuntimeError as exc:
        raise ValueError(f"the tensor's memory cannot be read ({exc})") from None
    start = raw.data_ptr()
    end = start + raw.numel()
    if not raw.is_contiguous() or start == 0 or start < base or end > base + size:
        raise ValueError("the tensor's bytes are not one contiguous range of its storage")
    return start, end


def _uint8() -> Any:
    import torch

    return torch.uint8


def digest_buffers(buffers: Sequence[Any]) -> list[int]:
    """XXH3-64 of each buffer, in one native call (GIL released, several threads)."""
    # looked up per call (a dict lookup once imported), so DENPEX_NO_EXTENSIONS set after
    # import still chooses the pure-Python twin
    return list(load("checksum").xxh3_64_many(buffers))


def combine(digests: Iterable[int]) -> int:
    """One XXH3-64 over a sequence of digests: a digest of the whole set, order included."""
    from array import array

    return int(load("checksum").xxh3_64(array("Q", digests).tobytes()))


def to_signed(digest: int) -> int:
    """A uint64 digest as the int64 a torch tensor can hold (same bits)."""
    return digest - (1 << 64) if digest >= 1 << 63 else digest


@dataclass
class TensorSet:
    """Named tensors hashed together; the byte views of CPU tensors are built once and reused
    while the tensors keep their storage (optimizers update parameters in place)."""

    names: list[str]
    tensors: list[Any]
    _views: list[Any] | None = field(default=None, repr=False)
    _ptrs: list[int] = field(default_factory=list, repr=False)

    @classmethod
    def of(cls, named: Iterable[tuple[str, Any]]) -> TensorSet:
        names, tensors = [], []
        for name, tensor in named:
            names.append(name)
            tensors.append(tensor)
        return cls(names, tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def on_cuda(self) -> bool:
        return any(t.is_cuda for t in self.tensors)

    def cpu_views(self) -> list[Any]:
        """Byte views of the tensors (all on CPU), rebuilt when a storage moved."""
        ptrs = [t.data_ptr() for t in self.tensors]
        if self._views is None or ptrs != self._ptrs:
            self._views = [byte_view(_contiguous(t)) for t in self.tensors]
            # a non-contiguous tensor was copied above; its pointer then never matches and the
            # views are rebuilt every time, which is correct if slower
            self._ptrs = ptrs
        return self._views

    def digest_now(self) -> list[int]:
        """Digests of the tensors as they are now, on the calling thread."""
        if not self.tensors:
            return []
        if not self.on_cuda:
            return digest_buffers(self.cpu_views())
        return CudaSnapshot(self.tensors).wait_digests()


def _contiguous(tensor: Any) -> Any:
    return tensor if tensor.is_contiguous() else tensor.contiguous()


class CudaSnapshot:
    """A device-to-host copy of CUDA tensors into one pinned buffer, then hashed per tensor.

    The copy is enqueued on the current stream (ordered after the optimizer's kernels) and
    does not block; `start_hashing()` hashes on a worker thread once the copy completed.
    """

    def __init__(self, tensors: Sequence[Any]) -> None:
        import torch

        nbytes = [t.numel() * t.element_size() for t in tensors]
        self.offsets = [0]
        for n in nbytes:
            self.offsets.append(self.offsets[-1] + n)
        total = self.offsets[-1]
        self.host = torch.empty(total, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        self._digests: list[int] | None = None
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        start = 0
        while start < len(tensors):
            end, size = start, 0
            while end < len(tensors) and (end == start or size + nbytes[end] <= CUDA_CHUNK_BYTES):
                size += nbytes[end]
                end += 1
            flat = [
                _contiguous(t.detach()).reshape(-1).view(torch.uint8) for t in tensors[start:end]
            ]
            staged = torch.cat(flat) if len(flat) > 1 else flat[0]
            dest = self.host[self.offsets[start] : self.offsets[end]]
            dest.copy_(staged, non_blocking=staged.is_cuda)
            start = end
        self.event = torch.cuda.Event() if torch.cuda.is_available() else None
        if self.event is not None:
            self.event.record()

    def _hash(self) -> None:
        try:
            if self.event is not None:
                self.event.synchronize()
            base = byte_view(self.host) if self.offsets[-1] else memoryview(b"")
            views = [base[a:b] for a, b in zip(self.offsets, self.offsets[1:], strict=False)]
            self._digests = digest_buffers(views)
        except BaseException as exc:  # reported to whoever waits
            self._error = exc

    def start_hashing(self, on_done: Callable[[], None] | None = None) -> None:
        def run() -> None:
            self._hash()
            if on_done is not None:
                on_done()

        self._thread = threading.Thread(target=run, name="denpex-sdk-checksum", daemon=True)
        self._thread.start()

    def wait_digests(self) -> list[int]:
        if self._thread is None:
            self._hash()
        else:
            self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._digests is not None
        return self._digests


def optimizer_state_tensors(optimizer: Any) -> list[tuple[str, Any]]:
    """(name, tensor) of every tensor in an optimizer's state, in a stable order."""
    named: list[tuple[str, Any]] = []
    index = 0
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key in sorted(state):
                value = state[key]
                if hasattr(value, "data_ptr") and value.numel() > 0:
                    named.append((f"optimizer.{index}.{key}", value))
            index += 1
    return named
