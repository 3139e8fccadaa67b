"""Dtype views (`view(dtype)`, `view_as_real`, `view_as_complex`, `.real`/`.imag`) alias one buffer on tpu as on CPU.

Before: `x.view(torch.int32)` read the float values converted (1.0 -> 1, not its bits 1065353216), and writes
through `view_as_real`, `.real`, `.imag` or `view_as_complex` were lost, so `torch.polar` and `torch.complex`
(PyTorch's decompositions write `result.real = ...`) returned zeros: gpt-fast's RoPE table was all zeros on tpu.
"""

from __future__ import annotations

import pytest
import torch


def _write_through_view_as_real(d):
    c = torch.tensor([1 + 1j, 2 + 2j], device=d)
    torch.view_as_real(c)[0, 0] = 5
    return c


def _real_mul_(d):
    c = torch.tensor([1 + 1j, 2 + 2j], device=d)
    c.real.mul_(2)
    return c


def _imag_set(d):
    c = torch.tensor([1 + 1j, 2 + 2j], device=d)
    c.imag = torch.tensor([7.0, 8.0], device=d)
    return c


def _view_as_complex_mul_(d):
    v = torch.tensor([1.0, 2.0, 3.0, 4.0], device=d)
    torch.view_as_complex(v.view(2, 2)).mul_(2)
    return v


def _bits_read(d):
    return torch.tensor([1.0, 2.0], device=d).view(torch.int32) + 0


def _bits_write(d):
    f = torch.tensor([1.0, -2.0], device=d)
    f.view(torch.int32).bitwise_and_(0x7FFFFFFF)  # (clears the sign bit: abs)
    return f


def _narrower_dtype_row(d):
    return torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=d).view(torch.uint8)[1] * 1


def _wider_dtype(d):
    return torch.arange(16, dtype=torch.uint8, device=d).view(4, 4).view(torch.int32)


def _bf16_halves(d):
    return torch.tensor([1.5, -3.25], device=d).view(torch.bfloat16).float()


def _sliced_view(d):
    return torch.arange(12.0, device=d).view(3, 4)[:, 1:3].view(torch.int32)


def _polar(d):
    return torch.polar(torch.tensor([1.0, 2.0], device=d), torch.tensor([0.5, 3.0], device=d))


def _complex(d):
    return torch.complex(torch.tensor([1.0, 2.0], device=d), torch.tensor([0.5, 3.0], device=d))


def _view_sees_later_writes(d):
    c = torch.tensor([1 + 1j, 2 + 2j], device=d)
    r = torch.view_as_real(c)
    c.mul_(2)
    return r * 1


def _rope(d):
    x = torch.arange(16.0, device=d).view(2, 4, 2) * 2
    f = torch.polar(torch.ones(4, device=d), torch.arange(4.0, device=d))
    return torch.view_as_real(torch.view_as_complex(x) * f).flatten(1)


def _fill_empty_through_view(d):
    e = torch.empty(4, device=d)
    e.view(torch.int32).fill_(7)
    return e.view(torch.int32)


def _gradient_through_complex_views(d):
    x = torch.arange(8.0, device=d).view(2, 2, 2).requires_grad_()
    torch.view_as_real(torch.view_as_complex(x * 1) * (1 + 2j)).sum().backward()
    return x.grad


CASES = [_write_through_view_as_real, _real_mul_, _imag_set, _view_as_complex_mul_, _bits_read, _bits_write,
         _narrower_dtype_row, _wider_dtype, _bf16_halves, _sliced_view, _polar, _complex, _view_sees_later_writes,
         _rope, _fill_empty_through_view, _gradient_through_complex_views]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_a_dtype_view_is_the_same_buffer_on_tpu_as_on_cpu(mode, case) -> None:
    want = case("cpu")
    got = case("tpu").cpu()
    assert got.dtype == want.dtype
    if want.is_floating_point() or want.is_complex():
        torch.testing.assert_close(got, want)
    else:
        assert torch.equal(got, want)


def test_view_dtype_errors_as_pytorch_does(mode) -> None:
    x = torch.arange(6.0, device="tpu").view(2, 3)
    with pytest.raises(RuntimeError, match=r"stride\(-1\) must be 1"):
        x.t().view(torch.uint8)  # (a non-contiguous last dimension cannot change element size)
    with pytest.raises(RuntimeError, match="last dimension of size 2"):
        torch.view_as_complex(x)


def test_a_dtype_views_storage_is_the_viewed_buffer(mode) -> None:
    c = torch.tensor([1 + 1j, 2 + 2j], device="tpu")
    r = torch.view_as_real(c)
    assert r.untyped_storage().nbytes() == c.untyped_storage().nbytes() == 16  # (one buffer, as on CPU)
    import copy

    torch.testing.assert_close(copy.deepcopy(r).cpu(), torch.view_as_real(c.cpu()))
    f = torch.zeros(4, device="tpu")
    f.view(torch.int32).untyped_storage().resize_(0)  # (what FSDP2 does to free a parameter)
    assert f.untyped_storage().nbytes() == 0
