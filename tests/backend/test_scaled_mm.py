"""`torch._scaled_mm` (float8 matmul: torchao's and nanochat's Float8Linear) runs on the device with CPU's values:
tensor-wise and row-wise scales, a bias; a float8 result takes the CPU fallback, with CPU's values too."""

from __future__ import annotations

import pytest
import torch

from tputool.backend import events

F8 = torch.float8_e4m3fn


def _case(kind: str):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=g).to(F8)
    b = torch.randn(8, 32, generator=g).to(F8).t()  # (column-major, as _scaled_mm wants its second operand)
    if kind == "row-wise":
        kw = {"scale_a": torch.rand(16, 1, generator=g), "scale_b": torch.rand(1, 8, generator=g)}
    else:
        kw = {"scale_a": torch.tensor(0.5), "scale_b": torch.tensor(2.0)}
    if kind == "bias":
        kw["bias"] = torch.randn(8, generator=g).bfloat16()
    return a, b, {**kw, "out_dtype": torch.bfloat16}


@pytest.mark.parametrize("kind", ["tensor-wise", "row-wise", "bias"])
def test_scaled_mm_runs_on_the_device_with_cpus_values(kind: str, mode: str, tpu_device: str) -> None:
    a, b, kw = _case(kind)
    want = torch._scaled_mm(a, b, **kw)
    dev = {k: v.to(tpu_device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    fallbacks = events.total("fallback")
    got = torch._scaled_mm(a.to(tpu_device), b.to(tpu_device), **dev)
    assert got.dtype == want.dtype and torch.equal(got.cpu(), want)
    assert events.total("fallback") == fallbacks  # (lowered: no CPU fallback)
