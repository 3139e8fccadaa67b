"""Factory lowerings (full, arange, *_like, scalar_tensor, eye, linspace, fill/zero)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from tputool.backend.lowerings import lowering
from tputool.backend.lowerings._util import default_float, describe, np_dtype

aten = torch.ops.aten


def _fill_dtype(fill_value, dtype):
    if dtype is not None:
        return np_dtype(dtype)
    d = describe(fill_value)
    kind = d[1] if d[0] == "s" else {"b": "b", "i": "i", "u": "i", "f": "f", "c": "c"}[d[1].kind]
    if kind == "b":
        return jnp.bool_
    if kind == "i":
        return jnp.int64
    if kind == "c":
        return jnp.complex64 if default_float() == jnp.float32 else jnp.complex128
    return default_float()


@lowering(aten.full.default)
def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.full(tuple(size), fill_value, _fill_dtype(fill_value, dtype))


@lowering(aten.scalar_tensor.default)
def scalar_tensor(s, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.asarray(s, np_dtype(dtype) or default_float())


@lowering(aten.full_like.default)
def full_like(self, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.full(self.shape, fill_value, np_dtype(dtype) or self.dtype)


@lowering(aten.zeros_like.default)
def zeros_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(self.shape, np_dtype(dtype) or self.dtype)


@lowering(aten.ones_like.default)
def ones_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.ones(self.shape, np_dtype(dtype) or self.dtype)


@lowering(aten.empty_like.default)
def empty_like(self, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    return jnp.zeros(self.shape, np_dtype(dtype) or self.dtype)


@lowering(aten.fill.Scalar, aten.fill.Tensor)
def fill(self, value):
    return jnp.full(self.shape, value, self.dtype)


@lowering(aten.zero.default)
def zero(self):
    return jnp.zeros(self.shape, self.dtype)


@lowering(aten.clone.default)
def clone(self, *, memory_format=None):
    return self


@lowering(aten.lift_fresh_copy.default)
def lift_fresh_copy(self):
    return self


def _arange_dtype(start, end, step, dtype):
    if dtype is not None:
        return np_dtype(dtype)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in (start, end, step)):
        return jnp.int64
    return default_float()


@lowering(aten.arange.start_step, static_scalars=True)
def arange(start, end, step=1, *, dtype=None, layout=None, device=None, pin_memory=None):
    dt = _arange_dtype(start, end, step, dtype)
    if jnp.issubdtype(dt, jnp.integer):
        # PyTorch computes the values from the bounds cast to the integer type; the length from them too for
        # int64, from the bounds as given for narrower types (as its CPU and CUDA kernels do).
        istart, iend, istep = int(start), int(end), int(step)
        n = -(-(iend - istart) // istep) if dt == jnp.int64 else math.ceil((end - start) / step)
        return (istart + istep * jnp.arange(max(0, n), dtype=jnp.int64)).astype(dt)
    n = max(0, math.ceil((end - start) / step))
    return (start + step * jnp.arange(n, dtype=jnp.float64)).astype(dt)


@lowering(aten.arange.default, static_scalars=True)
def arange_end(end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(0, end, 1, dtype=dtype)


@lowering(aten.arange.start, static_scalars=True)
def arange_start(start, end, *, dtype=None, layout=None, device=None, pin_memory=None):
    return arange(start, end, 1, dtype=dtype)


@lowering(aten.linspace.default, static_scalars=True)
def linspace(start, end, steps, *, dtype=None, layout=None, device=None, pin_memory=None):
    dt = np_dtype(dtype) or default_float()
    if jnp.issubdtype(dt, jnp.integer):
        step = (end - start) / (steps - 1) if steps > 1 else 0
        return (start + step * jnp.arange(steps, dtype=jnp.float64)).astype(dt)
    return jnp.linspace(start, end, steps, dtype=jnp.float64).astype(dt)


@lowering(aten.eye.default)
def eye(n, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, dtype=np_dtype(dtype) or default_float())


@lowering(aten.eye.m)
def eye_m(n, m, *, dtype=None, layout=None, device=None, pin_memory=None):
    return jnp.eye(n, m, dtype=np_dtype(dtype) or default_float())
