"""Size, stride and storage offset of the common view ops, worked out in Python.

A view is metadata only; PyTorch computes it in C++ and then calls `as_strided`, which for the tpu device
means a round trip through the dispatcher into a Python kernel. Fused mode (fused.py), which
already runs below autograd, instead builds these views directly from the geometry below. Each function
takes the op's arguments and returns (size, stride, offset), or None for a case it leaves to PyTorch
(which then also reports any error in PyTorch's words).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tputool.backend.views import contiguous_strides

aten = torch.ops.aten
Geometry = tuple[list[int], list[int], int]

_MAX = 2**63 - 1


def _dim(d: int, n: int) -> int | None:
    """Dimension `d` of a rank-`n` tensor as a non-negative index (rank 0 takes 0 and -1), or None."""
    m = max(n, 1)
    if not -m <= d < m:
        return None
    return d % m


def transpose(x: torch.Tensor, dim0: int, dim1: int) -> Geometry | None:
    size, stride, n = list(x.shape), list(x.stride()), x.dim()
    a, b = _dim(dim0, n), _dim(dim1, n)
    if a is None or b is None:
        return None
    if n:
        size[a], size[b] = size[b], size[a]
        stride[a], stride[b] = stride[b], stride[a]
    return size, stride, x.storage_offset()


def t(x: torch.Tensor) -> Geometry | None:
    if x.dim() > 2:
        return None
    return transpose(x, 0, 1) if x.dim() == 2 else (list(x.shape), list(x.stride()), x.storage_offset())


def permute(x: torch.Tensor, dims: list[int]) -> Geometry | None:
    n = x.dim()
    ds = [_dim(d, n) for d in dims]
    if len(ds) != n or None in ds or len(set(ds)) != n:
        return None
    size, stride = x.shape, x.stride()
    return [size[d] for d in ds], [stride[d] for d in ds], x.storage_offset()


def unsqueeze(x: torch.Tensor, dim: int) -> Geometry | None:
    n = x.dim()
    d = _dim(dim, n + 1)
    if d is None:
        return None
    size, stride = list(x.shape), list(x.stride())
    new_stride = 1 if d >= n else size[d] * stride[d]
    return size[:d] + [1] + size[d:], stride[:d] + [new_stride] + stride[d:], x.storage_offset()


def expand(x: torch.Tensor, size: list[int], implicit: bool = False) -> Geometry | None:
    old_size, old_stride = list(x.shape), list(x.stride())
    n, m = len(size), x.dim()
    if n < m:
        return None
    out_size, out_stride = [0] * n, [0] * n
    for i in range(n - 1, -1, -1):
        j = i - (n - m)
        want = size[i]
        if j < 0:  # a new leading dimension (PyTorch: size 1 keeps the stride a size-1 dim would have)
            if want < 0:
                return None
            out_size[i] = want
            out_stride[i] = 0 if want != 1 or i + 1 == n else out_size[i + 1] * out_stride[i + 1]
            continue
        have = old_size[j]
        if want == -1:
            want = have
        if have == want:
            out_size[i], out_stride[i] = have, old_stride[j]
        elif have == 1 and want >= 0:
            out_size[i], out_stride[i] = want, 0
        else:
            return None
    return out_size, out_stride, x.storage_offset()


def slice_(x: torch.Tensor, dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> Geometry | None:
    n = x.dim()
    d = _dim(dim, n)
    if d is None or n == 0 or step <= 0:
        return None
    size, stride = list(x.shape), list(x.stride())
    length = size[d]
    start = 0 if start is None else start
    end = _MAX if end is None else end
    if start < 0:
        start += length
    if end < 0:
        end += length
    start = min(max(start, 0), length)
    end = min(max(end, start), length)
    size[d] = (end - start + step - 1) // step
    offset = x.storage_offset() + start * stride[d]
    stride[d] *= step
    return size, stride, offset


def select(x: torch.Tensor, dim: int, index: int) -> Geometry | None:
    n = x.dim()
    d = _dim(dim, n)
    if d is None or n == 0:
        return None
    size, stride = list(x.shape), list(x.stride())
    if not -size[d] <= index < size[d]:
        return None
    index %= size[d]
    offset = x.storage_offset() + index * stride[d]
    return size[:d] + size[d + 1:], stride[:d] + stride[d + 1:], offset


def view(x: torch.Tensor, size: list[int]) -> Geometry | None:
    numel = x.numel()
    if numel == 0 or x.stride() != contiguous_strides(x.shape):
        return None  # (only row-major strides here: the general stride rule stays PyTorch's)
    size = list(size)
    if size.count(-1) > 1 or any(s < -1 for s in size):
        return None
    if -1 in size:
        rest = 1
        for s in size:
            if s != -1:
                rest *= s
        if rest == 0 or numel % rest:
            return None
        size[size.index(-1)] = numel // rest
    total = 1
    for s in size:
        total *= s
    if total != numel:
        return None
    return size, list(contiguous_strides(size)), x.storage_offset()


GEOMETRY: dict[torch._ops.OpOverload, Callable[..., Geometry | None]] = {
    aten.transpose.int: transpose,
    aten.t.default: t,
    aten.permute.default: permute,
    aten.unsqueeze.default: unsqueeze,
    aten.expand.default: expand,
    aten.slice.Tensor: slice_,
    aten.select.int: select,
    aten.view.default: view,
}
"""View op -> its geometry function (arguments as the op takes them)."""
