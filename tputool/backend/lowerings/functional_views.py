"""Traced-only lowerings: view ops as functional values, and the copies eager mode runs as storage kernels.

In a functionalized trace (Fused recording, compiled graphs, tune) a view is just a new value; eager dispatch
never runs these (a tpu view shares its storage: `tputool.backend.storage_kernels` and `view_geometry` make it), so
they are registered with `traced_only=True`.
"""

from __future__ import annotations

import jax.numpy as jnp
import torch
from jax import lax

from tputool.backend.lowerings import lowering

aten = torch.ops.aten


def _np_dtype(dtype: torch.dtype):
    from tputool.backend.dtypes import to_np

    return to_np(dtype)


def _dim(d: int, n: int) -> int:
    return d + n if d < 0 else d


def _slice(x, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, x.ndim)
    return x[(slice(None),) * dim + (slice(start, end, step),)]


def _expand(x, size, implicit=False):
    lead = len(size) - x.ndim
    shape = [x.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return jnp.broadcast_to(x, shape)


def _squeeze_dims(x, dims):
    dims = [dims] if isinstance(dims, int) else dims
    keep = tuple(d for d in (_dim(d, x.ndim) for d in dims) if x.shape[d] == 1)
    return jnp.squeeze(x, keep) if keep else x


def _as_strided(x, size, stride, storage_offset=None):
    from tputool.backend.views import strided_read

    return strided_read(x.reshape(-1), tuple(size), tuple(stride), storage_offset or 0)


def _split_with_sizes(x, sizes, dim=0):
    dim = _dim(dim, x.ndim)
    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    return tuple(lax.slice_in_dim(x, a, b, axis=dim) for a, b in zip(bounds, bounds[1:], strict=False))


def _split(x, split_size, dim=0):
    n = x.shape[_dim(dim, x.ndim)]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
    return _split_with_sizes(x, sizes, dim)


TRACED_ONLY: dict = {
    aten.alias.default: lambda x: x,
    aten.view.default: lambda x, size: jnp.reshape(x, size),
    aten._unsafe_view.default: lambda x, size: jnp.reshape(x, size),
    aten.reshape.default: lambda x, size: jnp.reshape(x, size),
    aten.permute.default: lambda x, dims: jnp.transpose(x, [_dim(d, x.ndim) for d in dims]),
    aten.t.default: lambda x: x.T,
    aten.transpose.int: lambda x, a, b: jnp.swapaxes(x, a, b),
    aten.expand.default: _expand,
    aten.unsqueeze.default: lambda x, d: jnp.expand_dims(x, _dim(d, x.ndim + 1)),
    aten.squeeze.dims: _squeeze_dims,
    aten.squeeze.dim: _squeeze_dims,
    aten.squeeze.default: lambda x: jnp.squeeze(x),
    aten.select.int: lambda x, d, i: jnp.take(x, i, axis=_dim(d, x.ndim)),
    aten.slice.Tensor: _slice,
    aten.narrow.default: lambda x, d, start, length: _slice(x, d, start, start + length),
    aten.as_strided.default: _as_strided,
    aten.diagonal.default: lambda x, offset=0, dim1=0, dim2=1: jnp.diagonal(x, offset, dim1, dim2),
    aten.split_with_sizes.default: _split_with_sizes,
    aten.split.Tensor: _split,
    aten.unbind.int: lambda x, dim=0: tuple(jnp.moveaxis(x, _dim(dim, x.ndim), 0)),
    aten.lift_fresh_copy.default: lambda x: x,
    aten._to_copy.default: lambda x, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
    memory_format=None: x if dtype is None else x.astype(_np_dtype(dtype)),
    aten.copy.default: lambda x, src, non_blocking=False: jnp.broadcast_to(src.astype(x.dtype), x.shape),
    aten.detach.default: lambda x: x,
    aten.view_as_real.default: lambda x: jnp.stack([x.real, x.imag], axis=-1),
    aten.view_as_complex.default: lambda x: lax.complex(x[..., 0], x[..., 1]),
}
"""View ops as functional values: op -> lowering (registered below with traced_only=True)."""

for _op, _fn in TRACED_ONLY.items():
    lowering(_op, traced_only=True)(_fn)
