"""FFT lowerings: ATen's three FFT primitives (`_fft_r2c`, `_fft_c2c`, `_fft_c2r`), behind every `torch.fft`
function, as `jnp.fft` transforms over the given dims, unnormalized, then scaled as `normalization` says
(0: none, 1: by 1/sqrt(n), 2: by 1/n, n the product of the signal sizes along the dims)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from tputool.backend.lowerings import lowering

aten = torch.ops.aten


def _normalized(out, sizes, normalization: int):
    n = math.prod(sizes)
    if normalization == 0 or n == 0:
        return out
    scale = 1 / math.sqrt(n) if normalization == 1 else 1 / n
    return (out * scale).astype(out.dtype)


@lowering(aten._fft_r2c.default)
def fft_r2c(self, dim, normalization, onesided):
    axes = tuple(d % self.ndim for d in dim)
    out = jnp.fft.rfftn(self, axes=axes) if onesided else jnp.fft.fftn(self, axes=axes)
    return _normalized(out, [self.shape[d] for d in axes], normalization)


@lowering(aten._fft_c2c.default)
def fft_c2c(self, dim, normalization, forward):
    axes = tuple(d % self.ndim for d in dim)
    if not axes:
        return self
    out = jnp.fft.fftn(self, axes=axes) if forward else jnp.fft.ifftn(self, axes=axes, norm="forward")
    return _normalized(out, [self.shape[d] for d in axes], normalization)


@lowering(aten._fft_c2r.default)
def fft_c2r(self, dim, normalization, last_dim_size):
    axes = tuple(d % self.ndim for d in dim)
    sizes = [self.shape[d] for d in axes[:-1]] + [last_dim_size]
    out = jnp.fft.irfftn(self, s=sizes, axes=axes, norm="forward")
    return _normalized(out, sizes, normalization)
