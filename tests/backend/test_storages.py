"""UntypedStorage methods on tpu storages: size/nbytes, resize_ (FSDP2 frees and re-allocates unsharded
parameters by resizing their storage to 0 bytes and back) and data_ptr, compared with CPU storages."""

from __future__ import annotations

import pytest
import torch


def test_storage_size_counts_the_bytes_of_the_data(dev: str) -> None:
    t = torch.arange(6, dtype=torch.float32, device=dev)
    assert t.untyped_storage().size() == t.untyped_storage().nbytes() == 24
    v = t.view(2, 3)[1]  # (a view sees the whole storage)
    assert v.untyped_storage().nbytes() == 24
    assert torch.empty(5, dtype=torch.int16, device=dev).untyped_storage().nbytes() == 10


def test_resize_to_zero_frees_and_back_reallocates_under_the_same_views(dev: str) -> None:
    flat = torch.zeros(6, device=dev)
    view = torch.as_strided(flat, (2, 3), (3, 1), 0)  # FSDP2's unsharded parameter over its all-gather output
    storage = flat.untyped_storage()
    storage.resize_(0)
    assert storage.size() == 0 and flat.untyped_storage().nbytes() == 0
    storage.resize_(24)
    assert storage.size() == 24
    flat.copy_(torch.arange(6.0, device=dev))
    torch.testing.assert_close(view.cpu(), torch.arange(6.0).view(2, 3))


def test_growing_a_storage_keeps_its_leading_bytes(dev: str) -> None:
    t = torch.arange(4, dtype=torch.float32, device=dev)
    t.untyped_storage().resize_(32)
    assert t.untyped_storage().nbytes() == 32
    torch.testing.assert_close(t.cpu(), torch.arange(4.0))
    t.untyped_storage().resize_(8)
    torch.testing.assert_close(t[:2].cpu(), torch.arange(2.0))


def test_resize_to_a_partial_element_is_refused(tpu_device: str) -> None:
    t = torch.zeros(2, dtype=torch.float32, device=tpu_device)
    with pytest.raises(RuntimeError, match="multiple of"):
        t.untyped_storage().resize_(6)


def test_storage_data_ptr_is_the_tensors(tpu_device: str) -> None:
    t = torch.zeros(3, device=tpu_device)
    _ = t.view(3, 1)  # (a view gives the storage a size, which made PyTorch call it invalid)
    assert t.untyped_storage().data_ptr() == t.data_ptr()
