"""Reduction lowerings: sum/mean/prod, max/min (with indices), var/std, all/any, cumulative ops, softmax."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch

from tputool.backend.lowerings import lowering
from tputool.backend.lowerings._util import KIND, np_dtype, promote

aten = torch.ops.aten


def dims(dim, ndim: int) -> tuple[int, ...] | None:
    """ATen dim argument -> a tuple of axes (None/[] = all axes, as in PyTorch)."""
    if dim is None:
        return None
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return None
    return tuple(d % ndim if ndim else 0 for d in dim)


def _axes(x, dim):
    ax = dims(dim, x.ndim)
    if x.ndim == 0:
        return ()
    return ax


def _sum_dtype(x, dtype):
    if dtype is not None:
        return np_dtype(dtype)
    if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_:
        return jnp.int64
    return x.dtype


def _acc(dt):
    """Accumulation dtype for low-precision floats (PyTorch accumulates bf16/fp16 in float32)."""
    return jnp.float32 if dt in (jnp.bfloat16, jnp.float16) else dt


@lowering(aten.sum.default)
def sum_all(self, *, dtype=None):
    out = _sum_dtype(self, dtype)
    return jnp.sum(self.astype(_acc(out))).astype(out)


@lowering(aten.sum.dim_IntList)
def sum_dim(self, dim, keepdim=False, *, dtype=None):
    out = _sum_dtype(self, dtype)
    return jnp.sum(self.astype(_acc(out)), axis=_axes(self, dim), keepdims=keepdim).astype(out)


@lowering(aten.prod.default)
def prod_all(self, *, dtype=None):
    out = _sum_dtype(self, dtype)
    return jnp.prod(self.astype(_acc(out))).astype(out)


@lowering(aten.prod.dim_int)
def prod_dim(self, dim, keepdim=False, *, dtype=None):
    out = _sum_dtype(self, dtype)
    return jnp.prod(self.astype(_acc(out)), axis=_axes(self, dim), keepdims=keepdim).astype(out)


def _mean_dtype(x, dtype):
    if dtype is not None:
        return np_dtype(dtype)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        raise RuntimeError(f"mean(): could not infer output dtype. Input dtype must be either a floating point "
                           f"or complex dtype. Got: {str(_tdt(x)).replace('torch.', '').capitalize()}")
    return x.dtype


def _tdt(x):
    from tputool.backend import dtypes

    return dtypes.to_torch(jnp.dtype(x.dtype))


@lowering(aten.mean.default)
def mean_all(self, *, dtype=None):
    out = _mean_dtype(self, dtype)
    return jnp.mean(self.astype(_acc(out))).astype(out)


@lowering(aten.mean.dim)
def mean_dim(self, dim, keepdim=False, *, dtype=None):
    out = _mean_dtype(self, dtype)
    return jnp.mean(self.astype(_acc(out)), axis=_axes(self, dim), keepdims=keepdim).astype(out)


@lowering(aten.amax.default)
def amax(self, dim=(), keepdim=False):
    return jnp.max(self, axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.amin.default)
def amin(self, dim=(), keepdim=False):
    return jnp.min(self, axis=_axes(self, dim), keepdims=keepdim)


@lowering(aten.max.default)
def max_all(self):
    return jnp.max(self)


@lowering(aten.min.default)
def min_all(self):
    return jnp.min(self)


@lowering(aten.max.dim)
def max_dim(self, dim, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    idx = jnp.argmax(self, axis=dim, keepdims=True)
    val = jnp.take_along_axis(self, idx, axis=dim)
    if not keepdim:
        val, idx = jnp.squeeze(val, dim), jnp.squeeze(idx, dim)
    return val, idx.astype(jnp.int64)


@lowering(aten.min.dim)
def min_dim(self, dim, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    idx = jnp.argmin(self, axis=dim, keepdims=True)
    val = jnp.take_along_axis(self, idx, axis=dim)
    if not keepdim:
        val, idx = jnp.squeeze(val, dim), jnp.squeeze(idx, dim)
    return val, idx.astype(jnp.int64)


@lowering(aten.argmax.default)
def argmax(self, dim=None, keepdim=False):
    if dim is None:
        r = jnp.argmax(self.reshape(-1))
        return (r.reshape((1,) * self.ndim) if keepdim else r).astype(jnp.int64)
    if self.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return jnp.argmax(self, axis=dim, keepdims=keepdim).astype(jnp.int64)


@lowering(aten.argmin.default)
def argmin(self, dim=None, keepdim=False):
    if dim is None:
        r = jnp.argmin(self.reshape(-1))
        return (r.reshape((1,) * self.ndim) if keepdim else r).astype(jnp.int64)
    if self.ndim == 0:
        return jnp.zeros((), jnp.int64)
    return jnp.argmin(self, axis=dim, keepdims=keepdim).astype(jnp.int64)


def _bool_out(x):
    return x.dtype if x.dtype == jnp.uint8 else jnp.bool_


@lowering(aten.all.default)
def all_(self):
    return jnp.all(self.astype(bool)).astype(_bool_out(self))


@lowering(aten.all.dim, aten.all.dims)
def all_dim(self, dim=None, keepdim=False):
    return jnp.all(self.astype(bool), axis=_axes(self, dim), keepdims=keepdim).astype(_bool_out(self))


@lowering(aten.any.default)
def any_(self):
    return jnp.any(self.astype(bool)).astype(_bool_out(self))


@lowering(aten.any.dim, aten.any.dims)
def any_dim(self, dim=None, keepdim=False):
    return jnp.any(self.astype(bool), axis=_axes(self, dim), keepdims=keepdim).astype(_bool_out(self))


def _var(x, dim, correction, keepdim):
    comp, res = promote(KIND.COMPLEX_TO_FLOAT, x)
    c = 1 if correction is None else correction
    xa = x.astype(_acc(x.dtype))
    return jnp.var(xa, axis=_axes(x, dim), ddof=c, keepdims=keepdim).astype(res)


@lowering(aten.var.correction)
def var(self, dim=None, *, correction=None, keepdim=False):
    return _var(self, dim, correction, keepdim)


@lowering(aten.std.correction)
def std(self, dim=None, *, correction=None, keepdim=False):
    return jnp.sqrt(_var(self, dim, correction, keepdim))


@lowering(aten.var_mean.correction)
def var_mean(self, dim=None, *, correction=None, keepdim=False):
    return _var(self, dim, correction, keepdim), jnp.mean(self.astype(_acc(self.dtype)), axis=_axes(self, dim),
                                                          keepdims=keepdim).astype(self.dtype)


@lowering(aten.std_mean.correction)
def std_mean(self, dim=None, *, correction=None, keepdim=False):
    v, m = var_mean(self, dim, correction=correction, keepdim=keepdim)
    return jnp.sqrt(v), m


@lowering(aten.logsumexp.default)
def logsumexp(self, dim, keepdim=False):
    comp, res = promote(KIND.INT_TO_FLOAT, self)
    x = self.astype(_acc(comp))
    return jax.nn.logsumexp(x, axis=_axes(self, dim), keepdims=keepdim).astype(res)


@lowering(aten.cumsum.default)
def cumsum(self, dim, *, dtype=None):
    out = _sum_dtype(self, dtype)
    if self.ndim == 0:
        return self.astype(out)
    return jnp.cumsum(self.astype(_acc(out)), axis=dim).astype(out)


@lowering(aten.cumprod.default)
def cumprod(self, dim, *, dtype=None):
    out = _sum_dtype(self, dtype)
    if self.ndim == 0:
        return self.astype(out)
    return jnp.cumprod(self.astype(_acc(out)), axis=dim).astype(out)


@lowering(aten._softmax.default)
def softmax(self, dim, half_to_float):
    x = self.astype(_acc(self.dtype))
    out = jax.nn.softmax(x, axis=dim) if self.ndim else jnp.ones_like(x)
    return out.astype(jnp.float32 if half_to_float else self.dtype)


@lowering(aten._safe_softmax.default)
def safe_softmax(self, dim, dtype=None):
    """softmax, with 0 (not NaN) along rows whose inputs are all -inf (attention rows that see no position)."""
    out = softmax(self if dtype is None else self.astype(np_dtype(dtype)), dim, False)
    empty = jnp.all(self == -jnp.inf, axis=dim if self.ndim else None, keepdims=True)
    return jnp.where(empty, jnp.zeros((), out.dtype), out)


@lowering(aten._log_softmax.default)
def log_softmax(self, dim, half_to_float):
    x = self.astype(_acc(self.dtype))
    out = jax.nn.log_softmax(x, axis=dim) if self.ndim else jnp.zeros_like(x)
    return out.astype(jnp.float32 if half_to_float else self.dtype)


@lowering(aten._softmax_backward_data.default)
def softmax_backward(grad_output, output, dim, input_dtype):
    g, y = grad_output.astype(_acc(grad_output.dtype)), output.astype(_acc(output.dtype))
    r = y * (g - jnp.sum(g * y, axis=dim, keepdims=True)) if y.ndim else jnp.zeros_like(g)
    return r.astype(np_dtype(input_dtype))


@lowering(aten._log_softmax_backward_data.default)
def log_softmax_backward(grad_output, output, dim, input_dtype):
    g, y = grad_output.astype(_acc(grad_output.dtype)), output.astype(_acc(output.dtype))
    r = g - jnp.exp(y) * jnp.sum(g, axis=dim, keepdims=True) if y.ndim else jnp.zeros_like(g)
    return r.astype(np_dtype(input_dtype))


@lowering(aten.linalg_vector_norm.default, static_scalars=True)
def vector_norm(self, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    x = self if dtype is None else self.astype(np_dtype(dtype))
    out_dt = jnp.finfo(x.dtype).dtype if not jnp.iscomplexobj(x) else jnp.real(x).dtype
    xa = jnp.abs(x.astype(_acc(x.dtype)))
    ax = _axes(self, dim)
    if ord == float("inf"):
        r = jnp.max(xa, axis=ax, keepdims=keepdim)
    elif ord == float("-inf"):
        r = jnp.min(xa, axis=ax, keepdims=keepdim)
    elif ord == 0:
        r = jnp.sum((xa != 0).astype(xa.dtype), axis=ax, keepdims=keepdim)
    elif ord == 1:
        r = jnp.sum(xa, axis=ax, keepdims=keepdim)
    elif ord == 2:
        r = jnp.sqrt(jnp.sum(xa * xa, axis=ax, keepdims=keepdim))
    else:
        r = jnp.sum(xa ** ord, axis=ax, keepdims=keepdim) ** (1.0 / ord)
    return r.astype(out_dt)


@lowering(aten.equal.default)
def equal(self, other):
    if self.shape != other.shape:
        return jnp.asarray(False)
    return jnp.all(self == other)


@lowering(aten.median.default)
def median_all(self):
    flat = jnp.sort(self.reshape(-1))
    return flat[(flat.shape[0] - 1) // 2]


@lowering(aten.median.dim)
def median_dim(self, dim, keepdim=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = dim % self.ndim
    idx = jnp.argsort(self, axis=d, stable=True)
    k = (self.shape[d] - 1) // 2
    i = jax.lax.slice_in_dim(idx, k, k + 1, axis=d)
    v = jnp.take_along_axis(self, i, axis=d)
    if not keepdim:
        v, i = jnp.squeeze(v, d), jnp.squeeze(i, d)
    return v, i.astype(jnp.int64)


@lowering(aten.histc.default, static_scalars=True)
def histc(self, bins=100, min=0, max=0):  # noqa: A002 - ATen's argument names
    """Counts in `bins` equal bins over [min, max] (the data's range when min == max); values outside are
    ignored and max falls in the last bin. Floating input as PyTorch's CPU kernel (bin = (x - min) * bins /
    (max - min) in the input's dtype); integer input as its CUDA kernel, the only one taking integers (the
    same in integer arithmetic, truncated)."""
    if bins <= 0:
        raise RuntimeError(f"torch.histc: bins must be > 0, but got {bins} for dimension 0")
    if not all(math.isfinite(v) for v in (min, max)):
        raise RuntimeError(f"torch.histc: range of [{min}, {max}] is not finite")
    if min > max:
        raise RuntimeError("torch.histc: max must be larger than min")
    integral = not jnp.issubdtype(self.dtype, jnp.inexact)
    if integral:
        lo, hi = jnp.asarray(int(min), jnp.int64), jnp.asarray(int(max), jnp.int64)
    else:
        lo, hi = jnp.asarray(min, jnp.float64), jnp.asarray(max, jnp.float64)
    x = self.reshape(-1).astype(jnp.int64) if integral else self.reshape(-1)
    if min == max and x.size:
        lo, hi = jnp.min(x).astype(lo.dtype), jnp.max(x).astype(hi.dtype)
    same = lo == hi
    lo, hi = jnp.where(same, lo - 1, lo), jnp.where(same, hi + 1, hi)
    lo, hi = lo.astype(x.dtype), hi.astype(x.dtype)
    inside = (x >= lo) & (x <= hi)
    span = jnp.where(inside, x - lo, 0)
    pos = span * bins // (hi - lo) if integral else (span * bins / (hi - lo)).astype(jnp.int64)
    pos = jnp.clip(pos, 0, bins - 1)
    counts = jnp.zeros((bins,), jnp.int64).at[pos].add(inside.astype(jnp.int64))
    return counts.astype(self.dtype)
