"""Sparse COO tensors on the tpu device: PyTorch's own sparse tensors, their indices and values tpu tensors.

A CUDA model may keep a sparse buffer (Whisper's `alignment_heads` is `to_sparse()`), so `model.to("tpu")` must
move one as it moves to CUDA. The tensor is PyTorch's SparseTensorImpl with the tpu device: PyTorch's factory
kernel builds it for any device, and the ops that only read its metadata (`_indices`, `_nnz`, ...) are PyTorch's
own, reached by redispatching to the SparseCPU key (they touch no data). The ops that compute (`coalesce`,
`to_dense`, `to_sparse`, sparse @ dense `mm`, `clone`) are written below with dense tpu ops on the indices and
values, as CPU's kernels compute them. Any other op on a tpu sparse tensor runs on CPU copies (the CPU fallback,
warned once per op); one that writes in place fails with one line naming it and what to do (`.to_dense()`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._pytree import tree_map

aten = torch.ops.aten
_SPARSE_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCPU)

METADATA_OPS = ("_sparse_coo_tensor_with_dims_and_tensors", "_sparse_coo_tensor_with_dims", "_indices", "_values",
                "indices", "values", "_nnz", "sparse_dim", "dense_dim", "_dimI", "_dimV", "is_coalesced",
                "_coalesced_", "sparse_resize_", "sparse_resize_and_clear_")
"""Ops whose SparseCPU kernel only builds or reads a SparseTensorImpl's fields: run for tpu sparse tensors too."""


def _redispatch(op: torch._ops.OpOverload) -> Callable:
    def kernel(*args, **kwargs):
        return op.redispatch(_SPARSE_CPU, *args, **kwargs)

    return kernel


def _make(indices: torch.Tensor, values: torch.Tensor, size: torch.Size, coalesced: bool) -> torch.Tensor:
    return torch.sparse_coo_tensor(indices, values, size, is_coalesced=coalesced, check_invariants=False)


def _accumulating(values: torch.Tensor) -> torch.Tensor:
    """Values as summed when indices repeat: a bool sum is a logical or (as CPU's add), done in int32."""
    return values.to(torch.int32) if values.dtype == torch.bool else values


def coalesce(self: torch.Tensor) -> torch.Tensor:
    """`_coalesce`: indices sorted and unique, the values at a repeated index summed (CPU's result)."""
    nnz, sd = self._nnz(), self.sparse_dim()
    indices, values = self._indices(), self._values()
    if nnz == 0:
        return _make(indices.clone(), values.clone(), self.shape, True)
    strides = [_prod(self.shape[i + 1:sd]) for i in range(sd)]
    linear = sum((indices[i] * strides[i] for i in range(sd)), torch.zeros_like(indices[0]))
    order = linear.argsort(stable=True)
    ordered = linear[order]
    first = torch.ones_like(ordered, dtype=torch.bool)  # the first entry of each distinct index
    first[1:] = ordered[1:] != ordered[:-1]
    group = first.cumsum(0) - 1
    unique = ordered[first]  # (its length is data: one read of the device, as CPU's kernel decides it)
    summed = _accumulating(values).new_zeros((unique.numel(), *values.shape[1:]))
    summed.index_add_(0, group, _accumulating(values)[order])
    rows = [torch.div(unique, s, rounding_mode="floor") % int(n) for s, n in zip(strides, self.shape[:sd],
                                                                                  strict=True)]
    return _make(torch.stack(rows), summed.to(values.dtype), self.shape, True)


def _prod(dims) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out


def to_dense(self: torch.Tensor, dtype: torch.dtype | None = None, masked_grad: bool | None = None) -> torch.Tensor:
    """`_to_dense`: zeros with every value added at its index (repeated indices sum, as on CPU)."""
    values = self._values()
    out = _accumulating(values).new_zeros(self.shape)
    if self._nnz():
        out.index_put_(tuple(self._indices()), _accumulating(values), accumulate=True)
    out = out.to(values.dtype)
    return out if dtype is None else out.to(dtype)


def dense_to_sparse(self: torch.Tensor, sparse_dim: int | None = None, *, layout: torch.layout | None = None,
                    blocksize=None, dense_dim: int | None = None) -> torch.Tensor:
    """`_to_sparse` of a dense tpu tensor into COO: an entry per index whose (dense part of the) value is
    non-zero, in sorted order, coalesced."""
    if layout not in (None, torch.sparse_coo) or blocksize is not None:
        raise NotImplementedError(f"to_sparse(layout={layout}) of a tpu tensor: only the COO layout is supported "
                                  "on tpu; convert on the CPU (.cpu().to_sparse(...))")
    if sparse_dim is None:
        sparse_dim = self.dim() - (dense_dim or 0)
    mask = self != 0
    if sparse_dim < self.dim():
        mask = mask.flatten(sparse_dim).any(-1)
    indices = mask.nonzero().t().contiguous()
    values = self[tuple(indices)] if sparse_dim else self.unsqueeze(0)
    return _make(indices, values, self.shape, True)


def clone(self: torch.Tensor, memory_format=None) -> torch.Tensor:
    """A sparse tensor with copies of the indices and values."""
    return _make(self._indices().clone(), self._values().clone(), self.shape, self.is_coalesced())


def mm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """sparse (2-D, scalar values) @ dense: each value times its column's row of `mat2`, added into its row
    (other layouts: the CPU fallback)."""
    if self.sparse_dim() != 2 or self.dense_dim() != 0 or mat2.layout != torch.strided or mat2.dim() != 2:
        return _fallback(aten.mm.default, self, mat2)
    if self.shape[1] != mat2.shape[0]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({self.shape[0]}x{self.shape[1]} and "
                           f"{mat2.shape[0]}x{mat2.shape[1]})")
    rows, cols = self._indices()
    out = mat2.new_zeros((self.shape[0], mat2.shape[1]))
    return out.index_add_(0, rows, self._values()[:, None] * mat2[cols])


def addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta=1, alpha=1) -> torch.Tensor:
    """beta * self + alpha * (sparse mat1 @ dense mat2); beta 0 ignores `self` (NaN included), as on CPU."""
    prod = mm(mat1, mat2)
    prod = prod if alpha == 1 else prod * alpha
    return prod if beta == 0 else prod + (self if beta == 1 else self * beta)


COMPUTE = {"_coalesce": coalesce, "_to_dense": to_dense, "clone": clone, "mm": mm, "addmm": addmm}
"""Ops on a tpu sparse tensor written with dense tpu ops (SparsePrivateUse1 kernels)."""
DENSE_INPUT = {"_to_sparse": dense_to_sparse, "_to_sparse.sparse_dim": dense_to_sparse}
"""Ops that make a sparse tensor from a dense tpu one (PrivateUse1 kernels)."""


def _refuse(op: torch._ops.OpOverload, why: str = "is not supported"):
    raise NotImplementedError(f"{op.name()} {why} for sparse COO tensors on tpu; call .to_dense() first")


def _fallback(op: torch._ops.OpOverload, *args, **kwargs):
    """Any other op with a tpu sparse argument: run on CPU copies, the results brought back (warned once per op,
    as every CPU fallback; TPUTOOL_FALLBACK=error refuses it). An in-place op is refused: its result would have to
    be written back into the tpu tensor's indices and values."""
    from tputool.backend import fallback

    if any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        _refuse(op, "(in place) is not supported")
    fallback.announce(op, " for sparse tensors")
    fallback.check_devices(op, args, kwargs)

    def to_cpu(x):
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            return x.to("cpu")
        return torch.device("cpu") if isinstance(x, torch.device) and x.type == "tpu" else x

    out = op(*tree_map(to_cpu, args), **tree_map(to_cpu, kwargs))
    return tree_map(lambda x: x.to("tpu") if isinstance(x, torch.Tensor) else x, out)


def register(lib: torch.library.Library) -> None:
    """Register the tpu sparse kernels on `lib` (an aten IMPL library)."""
    for name in METADATA_OPS:
        packet = getattr(aten, name)
        for overload in packet.overloads():
            qual = name if overload == "default" else f"{name}.{overload}"
            lib.impl(qual, _redispatch(getattr(packet, overload)), "SparsePrivateUse1")
    for name, kernel in COMPUTE.items():
        lib.impl(name, kernel, "SparsePrivateUse1")
    for name, kernel in DENSE_INPUT.items():
        lib.impl(name, kernel, "PrivateUse1")
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(_fallback, dispatch_key="SparsePrivateUse1", with_keyset=False)
    _libs.append(fallback)


_libs: list[torch.library.Library] = []


def libraries() -> list[torch.library.Library]:
    """The registrations `register` made besides `lib` (a forked child drops them with the device's kernels)."""
    return list(_libs)
