"""Parameter digests: XXH3-64 of each tensor's bytes (the oracle: the pure-Python XXH3 of
denpex._native.checksum_ref, itself tested equal to the `xxhash` package in tests/native),
zero-copy over CPU tensors and read through torch alone (no numpy)."""

from __future__ import annotations

import ctypes

import pytest

from denpex._native import checksum_ref

torch = pytest.importorskip("torch", reason="checksum tests hash torch tensors")

from denpex.sdk.checksums import (  # noqa: E402
    CudaSnapshot,
    TensorSet,
    _bounds,
    byte_view,
    combine,
    optimizer_state_tensors,
    to_signed,
)

# the digests go through the compiled checksum module and its pure-Python twin
pytestmark = pytest.mark.usefixtures("both_backends")


def oracle(tensor) -> int:
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return checksum_ref.xxh3_64(bytes(flat.tolist()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64])
def test_digests_equal_the_xxhash_package(dtype):
    gen = torch.Generator().manual_seed(3)
    tensors = [
        (torch.randn(17, 5, generator=gen) * 100).to(dtype),
        torch.tensor(2.5).to(dtype),  # 0-dim
        torch.zeros(0, dtype=dtype),  # empty
        (torch.randn(4, 6, generator=gen) * 100).to(dtype).t(),  # not contiguous
    ]
    got = TensorSet.of((str(i), t) for i, t in enumerate(tensors)).digest_now()
    assert got == [oracle(t) for t in tensors]
    assert got[2] == checksum_ref.xxh3_64(b"")


def test_cpu_views_share_the_tensor_storage():
    tensor = torch.randn(64, 64)
    view = byte_view(tensor)
    assert ctypes.addressof(view.obj) == tensor.data_ptr()  # the tensor's own memory
    assert view.nbytes == tensor.numel() * 4 and view.readonly is False
    tensors = TensorSet.of([("w", tensor)])
    before = tensors.digest_now()
    tensor.add_(1.0)  # in place, as optimizers update: the cached view sees it
    after = tensors.digest_now()
    assert before != after and after == [oracle(tensor)]


def test_views_are_rebuilt_when_a_parameter_gets_new_storage():
    param = torch.nn.Parameter(torch.ones(8))
    tensors = TensorSet.of([("p", param)])
    tensors.digest_now()
    param.data = torch.full((8,), 3.0)
    assert tensors.digest_now() == [oracle(param)]


def test_snapshot_path_matches_the_zero_copy_path():
    tensors = [torch.randn(33), torch.randn(7, 3).to(torch.bfloat16), torch.zeros(0)]
    snapshot = CudaSnapshot(tensors)  # on a machine without CUDA it stages CPU tensors alike
    snapshot.start_hashing()
    assert snapshot.wait_digests() == [oracle(t) for t in tensors]


def test_optimizer_state_is_listed_in_a_stable_order_and_combined():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    assert optimizer_state_tensors(optimizer) == []
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    names = [name for name, _ in optimizer_state_tensors(optimizer)]
    assert names == [
        "optimizer.0.exp_avg", "optimizer.0.exp_avg_sq", "optimizer.0.step",
        "optimizer.1.exp_avg", "optimizer.1.exp_avg_sq", "optimizer.1.step",
    ]  # fmt: skip
    assert combine([1, 2]) != combine([2, 1])
    assert to_signed(2**64 - 1) == -1 and to_signed(5) == 5


def test_a_view_keeps_its_memory_alive():
    view = byte_view(torch.arange(1000, dtype=torch.int64))  # nothing else holds the tensor
    assert bytes(view[:16]) == (0).to_bytes(8, "little") + (1).to_bytes(8, "little")


def test_a_tensor_without_readable_memory_is_refused_not_read():
    # a tensor subclass can report data_ptr 0 and no storage (DTensor and other wrappers, as
    # torch answers for them): reading that address would crash the training process
    class Wrapper:
        def data_ptr(self) -> int:
            return 0

        def numel(self) -> int:
            return 8

        def is_contiguous(self) -> bool:
            return True

        def untyped_storage(self):
            raise RuntimeError("Attempted to access the data pointer on an invalid python storage.")

    with pytest.raises(ValueError, match="cannot be read"):
        _bounds(Wrapper())
    part = torch.arange(10, dtype=torch.uint8)[2:5]
    assert _bounds(part) == (part.data_ptr(), part.data_ptr() + 3)
    with pytest.raises(ValueError, match="CPU tensor"):
        byte_view(torch.ones(2, device="meta"))
