"""torch.tpu.ops.grouped_matmul: the ragged (XLA) and gmm (Pallas megablox, interpret mode here) implementations
against the CPU torch loop, values and gradients, in Strict and Fused eager modes and under torch.compile."""

from __future__ import annotations

import pytest
import torch

import tputool.backend  # noqa: F401 - registers the device
from tputool.backend.graph import grouped_matmul as gm

SIZES = [5, 0, 11, 6]  # an empty group; 22 of 24 rows grouped: the last 2 rows are zero in the output


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lhs = torch.randn(24, 8, generator=g)
    rhs = torch.randn(len(SIZES), 8, 16, generator=g)
    return lhs, rhs, torch.tensor(SIZES, dtype=torch.int32), torch.randn(24, 16, generator=g)


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-4) -> None:
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=tol, atol=tol)


def _reference():
    lhs, rhs, sizes, grad = _inputs()
    lhs.requires_grad_()
    rhs.requires_grad_()
    out = torch.tpu.ops.grouped_matmul(lhs, rhs, sizes)
    out.backward(grad)
    return out.detach(), lhs.grad, rhs.grad


def test_cpu_reference_is_the_group_by_group_product():
    lhs, rhs, sizes, _ = _inputs()
    out = torch.tpu.ops.grouped_matmul(lhs, rhs, sizes)
    _close(out[:5], lhs[:5] @ rhs[0])
    _close(out[5:16], lhs[5:16] @ rhs[2])
    _close(out[16:22], lhs[16:22] @ rhs[3])
    assert out[22:].abs().max() == 0


def _run_tpu(impl: str, fn=None):
    lhs, rhs, sizes, grad = _inputs()
    tl, tr = (t.to("tpu").requires_grad_() for t in (lhs, rhs))
    call = fn or (lambda a, b, s: torch.tpu.ops.grouped_matmul(a, b, s, impl=impl))
    out = call(tl, tr, sizes.to("tpu"))
    out.backward(grad.to("tpu"))
    return out, tl.grad, tr.grad


@pytest.mark.parametrize("impl", gm.IMPLS)
def test_implementations_match_the_cpu_loop_values_and_grads(tpu_device, impl):
    for got, want in zip(_run_tpu(impl), _reference(), strict=True):
        _close(got, want)


@pytest.mark.parametrize("impl", gm.IMPLS)
def test_fused_mode(tpu_device, impl):
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    try:
        got = _run_tpu(impl, lambda a, b, s: torch.tpu.ops.grouped_matmul(a * 1.0, b, s, impl=impl) + 0.0)
        got = [t.cpu() for t in got]
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    for g, w in zip(got, _reference(), strict=True):
        _close(g, w)


@pytest.mark.parametrize("impl", gm.IMPLS)
def test_under_torch_compile(tpu_device, impl):
    @torch.compile(backend="tpu", fullgraph=True)
    def f(a, b, s):
        return torch.tpu.ops.grouped_matmul(a, b, s, impl=impl) * 2.0

    out, gl, gr = _run_tpu(impl, f)
    ref_out, ref_gl, ref_gr = _reference()
    _close(out, 2 * ref_out)
    _close(gl, 2 * ref_gl)
    _close(gr, 2 * ref_gr)


def test_bad_arguments_are_named(tpu_device):
    lhs, rhs, sizes, _ = _inputs()
    with pytest.raises(ValueError, match="unknown impl"):
        torch.tpu.ops.grouped_matmul(lhs, rhs, sizes, impl="dense")
    with pytest.raises(ValueError, match=r"rhs \(g, k, n\)"):
        torch.tpu.ops.grouped_matmul(lhs, rhs[:, :4], sizes)


def test_default_tiling_divides_rows_and_caps_lanes():
    assert gm.default_tiling(24, 8, 16) == (8, 8, 16)
    assert gm.default_tiling(512, 4096, 14336) == (128, 128, 128)
    assert gm.default_tiling(30, 256, 64) == (30, 128, 64)
