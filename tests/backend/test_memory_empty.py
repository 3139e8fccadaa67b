"""`torch.tpu.memory_allocated()` counts a tensor made by `torch.empty` at once, as CUDA's allocator does."""

import torch


def test_empty_counts_before_it_is_written_and_not_twice_after():
    base = torch.tpu.memory_allocated()
    y = torch.empty(1 << 20, device="tpu")
    assert torch.tpu.memory_allocated() - base == 4 << 20  # float32: 4 MiB, before any write
    y.fill_(1.0)
    assert torch.tpu.memory_allocated() - base == 4 << 20  # written: the same bytes, counted once
    del y
    assert torch.tpu.memory_allocated() == base
    z = torch.empty(256, 256, dtype=torch.bfloat16, device="tpu")
    assert torch.tpu.memory_allocated() - base == 256 * 256 * 2
    assert torch.tpu.max_memory_allocated() >= base + (4 << 20)
    del z
    assert torch.tpu.memory_allocated() == base
