"""Data-dependent ops (nonzero, masked_select, boolean-mask indexing) give CPU's results and errors; small ones run
on the host, launching no device program, so a decoder's `tokens[tokens >= k]` (one token longer each step) does
not compile two programs per token (Whisper's timestamp rules: 450 such calls, 20 s of a 98 s transcribe)."""

from __future__ import annotations

import pytest
import torch

from tputool.backend import events
from tputool.backend.storage_kernels import HOST_MAX_ELEMENTS

CASES = {
    "nonzero": lambda x: torch.nonzero(x > 0.5),
    "masked_select": lambda x: torch.masked_select(x, x > 0.5),
    "mask_index": lambda x: x[x > 0.5],
    "row_mask": lambda x: x.reshape(-1, 4)[x.reshape(-1, 4)[:, 0] > 0.5, 1:],
    "mask_and_index": lambda x: x.reshape(-1, 4)[x.reshape(-1, 4)[:, 0] > 0.5, torch.tensor(1, device=x.device)],
}


@pytest.mark.parametrize("size", [12, HOST_MAX_ELEMENTS + 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_data_dependent_ops_match_cpu_small_on_the_host_large_on_the_device(tpu_device, case, size):
    x = torch.rand(size, generator=torch.Generator().manual_seed(size))
    d = x.to("tpu")
    fn = CASES[case]
    mask_ready = d > 0.5  # (the comparisons themselves launch: count only the data-dependent op)
    del mask_ready
    before = events.launches
    got = fn(d)
    launched = events.launches - before
    torch.testing.assert_close(got.cpu(), fn(x), rtol=0, atol=0)
    assert got.device.type == "tpu"
    if size <= HOST_MAX_ELEMENTS and case in ("nonzero", "masked_select", "mask_index"):
        assert launched <= 1, launched  # the comparison only: the selection ran on the host
    elif size > HOST_MAX_ELEMENTS:
        assert launched >= 2  # the size, then the selection, on the device


def test_mask_errors_and_mixed_devices_as_on_cpu(tpu_device):
    x = torch.arange(10.0, device="tpu")
    with pytest.raises(IndexError, match=r"The shape of the mask \[3\] at index 0 does not match"):
        x[torch.ones(3, dtype=torch.bool, device="tpu")]
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.masked_select(x, torch.ones(10, dtype=torch.bool))
    torch.testing.assert_close(x[torch.arange(10) > 6].cpu(), torch.tensor([7.0, 8.0, 9.0]))  # a CPU mask: allowed
    y = x.clone().requires_grad_(True)
    y[y.detach() > 6].sum().backward()
    torch.testing.assert_close(y.grad.cpu(), (torch.arange(10.0) > 6).float())


@pytest.mark.parametrize("size", [12, HOST_MAX_ELEMENTS + 4])
def test_gradient_of_mask_indexing_runs_on_the_device(tpu_device, size, recwarn):
    """`loss = f(logits[mask])`: the backward is a functional index_put by the mask, which ran on the CPU whole
    (the full-size gradient copied to the host and back, a fallback warning); its coordinates are found first now."""
    x = torch.rand(size, generator=torch.Generator().manual_seed(3))
    want = torch.zeros(size)
    want[x > 0.5] = 2 * x[x > 0.5]
    d = x.to("tpu").requires_grad_(True)
    d[d.detach() > 0.5].pow(2).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), want)
    assert not [w for w in recwarn if "runs on CPU" in str(w.message)]
    out = torch.index_put(torch.zeros(3, 2, device="tpu"), (torch.tensor([True, False, True], device="tpu"),),
                          torch.ones(2, 2, device="tpu"), accumulate=True)
    torch.testing.assert_close(out.cpu(), torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]))
