"""Strided reads and writes of a flat JAX buffer: how a tpu view (size, stride, offset) sees its storage.

Each geometry (size, stride; the storage offset is an argument where it is not 0) gets one cached `jax.jit`
kernel. Reads use reshape/slice/transpose when the strides nest
(slices, transposes, selects, expands: no gather), else a gather whose indices are built in-graph from
iotas (no large constants). Writes use a full replace, a contiguous dynamic_update_slice, or a scatter.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax


def _nested_order(size: tuple, stride: tuple) -> list[int] | None:
    """Dims (size > 1, stride > 0) sorted by stride, descending, if each fits inside the next larger one."""
    dims = [d for d in range(len(size)) if size[d] != 1 and stride[d] != 0]
    order = sorted(dims, key=lambda d: -stride[d])
    for a, b in zip(order, order[1:], strict=False):
        if stride[a] % stride[b] or size[b] * stride[b] > stride[a]:
            return None
    return order


def _index(size: tuple, stride: tuple, offset: int, n: int) -> jax.Array:
    """Flat storage index of every element of the view, built from iotas."""
    itype = jnp.int32 if n < 2**31 else jnp.int64
    idx = jnp.full(size, offset, itype)
    for d in range(len(size)):
        if size[d] != 1 and stride[d] != 0:
            idx = idx + lax.broadcasted_iota(itype, size, d) * jnp.asarray(stride[d], itype)
    return idx


def strided_read(flat: jax.Array, size: tuple, stride: tuple, offset: int) -> jax.Array:
    """The view (size, stride, offset) of the 1-D array `flat`, as a new array of shape `size`."""
    n = flat.shape[0]
    if math.prod(size) == 0:
        return jnp.zeros(size, flat.dtype)
    order = _nested_order(size, stride)
    if order is None:
        return flat[_index(size, stride, offset, n)]
    dims = sorted(order)
    x = _layout_slice(flat, size, stride, offset, order) if order else None
    if x is not None:
        x = jnp.transpose(x, [order.index(d) for d in dims])
    elif not order:
        x = flat[offset]
    else:
        s0, n0 = stride[order[0]], size[order[0]]
        need = offset + n0 * s0
        x = jnp.pad(flat, (0, need - n)) if need > n else flat
        x = x[offset:need].reshape(n0, s0)
        for d in order[1:]:
            x = x[..., : size[d] * stride[d]].reshape(x.shape[:-1] + (size[d], stride[d]))
        x = x[..., 0]
        x = jnp.transpose(x, [order.index(d) for d in dims])
    x = x.reshape([size[d] if d in dims else 1 for d in range(len(size))])
    return jnp.broadcast_to(x, size)


def _layout_slice(flat: jax.Array, size: tuple, stride: tuple, offset: int, order: list[int]) -> jax.Array | None:
    """The view as one reshape of `flat` into its stride layout plus one slice (dims in `order`), or None.

    With nested strides s0 > s1 > ... > sk, the buffer reshapes to (n // s0, s0 // s1, ..., s(k-1) // sk, sk);
    the view is the box starting at the offset's digits in that layout, when the box fits (no wrap-around).
    This is what slices, transposes and selects of a contiguous tensor give, without padding the buffer.
    """
    n = flat.shape[0]
    strides = [stride[d] for d in order]
    if n % strides[0]:
        return None
    layout = [n // strides[0]] + [a // b for a, b in zip(strides, strides[1:], strict=False)] + [strides[-1]]
    start, rest = [], offset
    for s_ in strides:
        start.append(rest // s_)
        rest %= s_
    start.append(rest)
    extent = [size[d] for d in order] + [1]
    if any(a + m > lim for a, m, lim in zip(start, extent, layout, strict=True)):
        return None
    x = lax.slice(flat.reshape(layout), start, [a + m for a, m in zip(start, extent, strict=True)])
    return x.reshape(extent[:-1])


def strided_write(flat: jax.Array, value: jax.Array, size: tuple, stride: tuple, offset: int) -> jax.Array:
    """`flat` with the elements of the view (size, stride, offset) replaced by `value` (shape `size`)."""
    if math.prod(size) == 0:
        return flat
    value = value.astype(flat.dtype)
    if _is_contiguous(size, stride):
        return lax.dynamic_update_slice(flat, value.reshape(-1), (offset,))
    return flat.at[_index(size, stride, offset, flat.shape[0]).reshape(-1)].set(value.reshape(-1))


def view_span(size: tuple, stride: tuple) -> int:
    """Elements from a view's first to its last in storage, both included (0 for an empty view)."""
    if math.prod(size) == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(size, stride, strict=True))


def strided_read_at(flat: jax.Array, size: tuple, stride: tuple, offset: jax.Array) -> jax.Array:
    """`strided_read` with an offset that is a value of the program (a traced integer), not a constant: a
    script slicing a stored tensor at a new offset each step (a batch of a dataset kept on the device) runs
    one program for every offset. A valid view never reaches past the buffer, so the window is never clamped."""
    span = view_span(size, stride)
    if not span:
        return jnp.zeros(size, flat.dtype)
    return strided_read(lax.dynamic_slice(flat, (offset,), (span,)), size, stride, 0)


def strided_write_at(flat: jax.Array, value: jax.Array, size: tuple, stride: tuple, offset: jax.Array) -> jax.Array:
    """`strided_write` with a traced offset (see `strided_read_at`)."""
    span = view_span(size, stride)
    if not span:
        return flat
    window = strided_write(lax.dynamic_slice(flat, (offset,), (span,)), value, size, stride, 0)
    return lax.dynamic_update_slice(flat, window, (offset,))


def _is_contiguous(size: tuple, stride: tuple) -> bool:
    expected = 1
    for s, st in zip(reversed(size), reversed(stride), strict=True):
        if s != 1 and st != expected:
            return False
        expected *= s
    return True


def contiguous_strides(size) -> tuple[int, ...]:
    """Row-major strides of `size` (size-0 dims count as 1, as PyTorch's)."""
    out, acc = [], 1
    for s in reversed(size):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def is_contiguous(size: tuple, stride: tuple) -> bool:
    """True when (size, stride) is row-major contiguous (size-1 dims may have any stride)."""
    return _is_contiguous(size, stride)


def read(base: jax.Array, size: tuple, stride: tuple, offset: int) -> jax.Array:
    """The view (size, stride, offset) of `base`, by a jitted kernel per geometry; one kernel serves every nonzero
    offset (it is an argument: slicing a stored tensor at a new offset each step compiles nothing new)."""
    if offset:
        return _reader_at(base.shape, size, stride)(base, offset)
    return _reader(base.shape, size, stride)(base)


def write(base: jax.Array, value: jax.Array, size: tuple, stride: tuple, offset: int) -> jax.Array:
    """`base` with the view (size, stride, offset) replaced by `value` (kernels as `read`'s)."""
    if offset:
        return _writer_at(base.shape, size, stride)(base, value, offset)
    return _writer(base.shape, size, stride)(base, value)


@functools.cache
def _reader(base_shape: tuple, size: tuple, stride: tuple):
    return jax.jit(lambda base: strided_read(base.reshape(-1), size, stride, 0))


@functools.cache
def _reader_at(base_shape: tuple, size: tuple, stride: tuple):
    return jax.jit(lambda base, offset: strided_read_at(base.reshape(-1), size, stride, offset))


@functools.cache
def _writer(base_shape: tuple, size: tuple, stride: tuple):
    return jax.jit(lambda base, value: strided_write(base.reshape(-1), value, size, stride, 0).reshape(base_shape))


@functools.cache
def _writer_at(base_shape: tuple, size: tuple, stride: tuple):
    return jax.jit(lambda base, value, offset: strided_write_at(base.reshape(-1), value, size, stride,
                                                                offset).reshape(base_shape))


# ---- dtype views: one buffer seen as another dtype ------------------------------------------------

def _as_bits(flat: jax.Array) -> jax.Array:
    """A flat buffer as a flat buffer `bitcast_convert_type` takes: complex as its (real, imag) pairs, bool as bytes."""
    if jnp.issubdtype(flat.dtype, jnp.complexfloating):
        return jnp.stack([flat.real, flat.imag], axis=-1).reshape(-1)
    if flat.dtype == jnp.bool_:
        return flat.astype(jnp.uint8)
    return flat


@functools.partial(jax.jit, static_argnums=1)
def reinterpret(flat: jax.Array, dtype) -> jax.Array:
    """The bytes of 1-D buffer `flat` as a 1-D buffer of `dtype` (PyTorch's `view(dtype)`: no value converted)."""
    dtype = jnp.dtype(dtype)
    if flat.dtype == dtype:
        return flat
    bits = _as_bits(flat)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        part = jnp.dtype(jnp.float32 if dtype == jnp.complex64 else jnp.float64)
        pairs = reinterpret(bits, part).reshape(-1, 2)
        return lax.complex(pairs[:, 0], pairs[:, 1])
    target = jnp.dtype(jnp.uint8) if dtype == jnp.bool_ else dtype
    src = bits.dtype.itemsize
    if src == target.itemsize:
        out = lax.bitcast_convert_type(bits, target)
    elif src > target.itemsize:
        out = lax.bitcast_convert_type(bits, target).reshape(-1)
    else:
        out = lax.bitcast_convert_type(bits.reshape(-1, target.itemsize // src), target)
    return out != 0 if dtype == jnp.bool_ else out
