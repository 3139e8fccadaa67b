"""Indexing and data-movement lowerings (non-view): cat, index, gather/scatter, index_put, masked_fill,
padding, flip/roll, tril/triu, sort/topk, repeat, embedding backward. View ops are aliases (storage_kernels.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from tputool.backend.lowerings import Unsupported, lowering
from tputool.backend.lowerings._util import KIND, cast, promote
from tputool.backend.lowerings.checks import BOUNDS, INDEX_COPY, OUT_OF_RANGE, require_in_range

aten = torch.ops.aten


@lowering(aten.cat.default)
def cat(tensors, dim=0):
    ts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not ts:
        comp, res = promote(KIND.NO_OPMATH, *tensors)
        return jnp.zeros((0,), res)
    comp, res = promote(KIND.NO_OPMATH, *ts)
    d = dim % ts[0].ndim
    return jnp.concatenate([cast(t, res) for t in ts], axis=d)


@lowering(aten.stack.default)
def stack(tensors, dim=0):
    comp, res = promote(KIND.NO_OPMATH, *tensors)
    return jnp.stack([cast(t, res) for t in tensors], axis=dim % (tensors[0].ndim + 1))


def _indices(self, indices):
    """ATen advanced indices (list of Optional[Tensor], bool masks allowed) -> a jnp index tuple."""
    out = []
    for i in indices:
        if i is None:
            out.append(slice(None))
        elif i.dtype == jnp.bool_ or i.dtype == jnp.uint8:
            raise Unsupported("boolean mask indices have a data-dependent shape")
        else:
            out.append(i)
    return tuple(out)


def _check_indices(self, indices) -> None:
    """Advanced indices lie in [-size, size) of the dimension each one indexes."""
    for k, i in enumerate(indices):
        if i is not None and i.dtype != jnp.bool_ and i.dtype != jnp.uint8:
            require_in_range(i, -self.shape[k], self.shape[k], BOUNDS, k)


def _has_mask(indices) -> bool:
    return any(i is not None and (i.dtype == jnp.bool_ or i.dtype == jnp.uint8) for i in indices)


@lowering(aten.index.Tensor, checked=True)
def index(self, indices):
    _check_indices(self, indices)
    return _index(self, indices)


def _index(self, indices):
    if _has_mask(indices):
        raise Unsupported("index with a boolean mask: data-dependent shape")
    return self[_indices(self, indices)]


SCALAR_TYPE_NAMES = {"float32": "Float", "float64": "Double", "float16": "Half", "bfloat16": "BFloat16",
                     "int64": "Long", "int32": "Int", "int16": "Short", "int8": "Char", "uint8": "Byte",
                     "bool": "Bool", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}
"""PyTorch's ScalarType names of the dtypes, as its error messages spell them."""


def _check_value_dtype(self, indices, values) -> None:
    """PyTorch's index_put refuses values of another dtype on every device (`x[idx] = v` with a float32 `v` into a
    bfloat16 `x`), except where it becomes a masked_fill: one value put through one boolean mask."""
    if values.dtype == self.dtype:
        return
    given = [i for i in indices if i is not None]
    if values.size == 1 and len(given) == 1 and given[0].dtype in (jnp.bool_, jnp.uint8):
        return
    name = SCALAR_TYPE_NAMES.get
    raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                       f"{name(self.dtype.name, self.dtype.name)} for the destination and "
                       f"{name(values.dtype.name, values.dtype.name)} for the source.")


@lowering(aten.index_put.default, checked=True)
def index_put(self, indices, values, accumulate=False):
    _check_indices(self, indices)
    _check_value_dtype(self, indices, values)
    return _index_put(self, indices, values, accumulate)


def _index_put(self, indices, values, accumulate=False):
    if (_has_mask(indices) and len(indices) == 1 and not accumulate and values.size == 1
            and indices[0].shape == self.shape[: indices[0].ndim]):
        m = indices[0].astype(bool).reshape(indices[0].shape + (1,) * (self.ndim - indices[0].ndim))
        return jnp.where(m, values.reshape(()).astype(self.dtype), self)
    idx = _indices(self, indices) if not _has_mask(indices) else _mask_index(self, indices)
    v = values.astype(self.dtype)
    return _add_at(self, idx, v) if accumulate else self.at[idx].set(v)


def _add_at(x, idx, v):
    """x.at[idx].add(v), where adding bools is PyTorch's saturating add (a logical or; JAX refuses bool add)."""
    return x.at[idx].max(v) if x.dtype == jnp.bool_ else x.at[idx].add(v)


def _mul_at(x, idx, v):
    """x.at[idx].multiply(v); multiplying bools is a logical and."""
    return x.at[idx].min(v) if x.dtype == jnp.bool_ else x.at[idx].multiply(v)


def _mask_index(self, indices):
    raise Unsupported("index_put with a boolean mask: data-dependent positions")


@lowering(aten._index_put_impl.default, checked=True)
def index_put_impl(self, indices, values, accumulate=False, unsafe=False):
    return index_put(self, indices, values, accumulate)


@lowering(aten._unsafe_index.Tensor)
def unsafe_index(self, indices):
    return _index(self, indices)


@lowering(aten._unsafe_index_put.default)
def unsafe_index_put(self, indices, values, accumulate=False):
    return _index_put(self, indices, values, accumulate)


@lowering(aten.index_select.default, checked=True)
def index_select(self, dim, index):
    if self.ndim == 0:
        require_in_range(index, 0, 1, OUT_OF_RANGE)
        return self
    require_in_range(index, 0, self.shape[dim], OUT_OF_RANGE)
    return jnp.take(self, index.reshape(-1), axis=dim)


@lowering(aten.gather.default, checked=True)
def gather(self, dim, index, *, sparse_grad=False):
    if index.size == 0:
        return jnp.zeros(index.shape, self.dtype)
    d = dim % max(self.ndim, 1)
    require_in_range(index, 0, self.shape[d] if self.ndim else 1, BOUNDS, d)
    if self.ndim == 0 or index.ndim == 0:
        return self.reshape(-1)[index.reshape(-1)].reshape(index.shape) if index.ndim == 0 else \
            jnp.broadcast_to(self, index.shape)
    idx = [jnp.broadcast_to(jnp.arange(s).reshape([-1 if j == k else 1 for j in range(index.ndim)]), index.shape)
           for k, s in enumerate(index.shape)]
    idx[d] = index
    return self[tuple(idx)]


def _scatter_index(self, dim, index):
    if index.size == 0:
        raise _Empty
    d = dim % max(self.ndim, 1)
    require_in_range(index, 0, self.shape[d] if self.ndim else 1, BOUNDS, d)
    idx = [jnp.broadcast_to(jnp.arange(s).reshape([-1 if j == k else 1 for j in range(index.ndim)]), index.shape)
           for k, s in enumerate(index.shape)]
    idx[d] = index
    return tuple(idx)


class _Empty(Exception):
    """An empty index: scatter ops leave self unchanged."""


def _empty_ok(fn):
    def wrapped(self, *args, **kwargs):
        try:
            return fn(self, *args, **kwargs)
        except _Empty:
            return self

    wrapped.__name__ = fn.__name__
    return wrapped


def _src_block(src, index):
    if not hasattr(src, "shape") or src.ndim == 0:
        return src
    return src[tuple(slice(0, s) for s in index.shape)]


@lowering(aten.scatter.src, aten.scatter.value, checked=True)
@_empty_ok
def scatter(self, dim, index, src):
    if self.ndim == 0:
        return jnp.asarray(src if not hasattr(src, "shape") else src.reshape(()), self.dtype)
    return self.at[_scatter_index(self, dim, index)].set(cast(_src_block(src, index), self.dtype))


@lowering(aten.scatter.reduce, aten.scatter.value_reduce, checked=True)
@_empty_ok
def scatter_reduce_legacy(self, dim, index, src, *, reduce):
    idx = _scatter_index(self, dim, index)
    v = cast(_src_block(src, index), self.dtype)
    return _add_at(self, idx, v) if reduce == "add" else _mul_at(self, idx, v)


@lowering(aten.scatter_add.default, checked=True)
@_empty_ok
def scatter_add(self, dim, index, src):
    if self.ndim == 0:
        return self + src.reshape(()).astype(self.dtype)
    return _add_at(self, _scatter_index(self, dim, index), _src_block(src, index).astype(self.dtype))


@lowering(aten.scatter_reduce.two, checked=True)
@_empty_ok
def scatter_reduce(self, dim, index, src, reduce, *, include_self=True):
    idx = _scatter_index(self, dim, index)
    v = _src_block(src, index).astype(self.dtype)
    if reduce == "sum":
        base = self if include_self else self.at[idx].set(0)
        return _add_at(base, idx, v)
    if reduce == "prod":
        base = self if include_self else self.at[idx].set(1)
        return _mul_at(base, idx, v)
    if reduce in ("amax", "amin"):
        if self.dtype == jnp.bool_:
            init = reduce == "amin"
        else:
            fill = (jnp.finfo if jnp.issubdtype(self.dtype, jnp.floating) else jnp.iinfo)(self.dtype)
            init = fill.min if reduce == "amax" else fill.max
        base = self if include_self else self.at[idx].set(init)
        return base.at[idx].max(v) if reduce == "amax" else base.at[idx].min(v)
    if reduce == "mean":
        base = self if include_self else self.at[idx].set(0)
        total = base.at[idx].add(v)
        count = jnp.ones_like(self) if include_self else jnp.zeros_like(self)
        count = count.at[idx].add(jnp.ones_like(v))
        count = jnp.where(count == 0, 1, count)
        out = total / count
        return out.astype(self.dtype) if jnp.issubdtype(self.dtype, jnp.floating) else (total // count).astype(
            self.dtype)
    raise NotImplementedError(f"scatter_reduce with reduce={reduce!r}")


@lowering(aten.index_add.default, checked=True)
def index_add(self, dim, index, source, *, alpha=1):
    d = dim % max(self.ndim, 1)
    require_in_range(index, 0, self.shape[d] if self.ndim else 1, BOUNDS, d)
    if self.ndim == 0:
        return self + source.reshape(()) * alpha
    src = source if isinstance(alpha, int | float) and alpha == 1 else source * alpha
    idx = [slice(None)] * self.ndim
    idx[d] = index
    return _add_at(self, tuple(idx), src.astype(self.dtype))


@lowering(aten.index_copy.default, checked=True)
def index_copy(self, dim, index, source):
    d = dim % max(self.ndim, 1)
    require_in_range(index, 0, self.shape[d] if self.ndim else 1, INDEX_COPY, d)
    if self.ndim == 0:
        return source.reshape(()).astype(self.dtype)
    idx = [slice(None)] * self.ndim
    idx[dim % self.ndim] = index
    return self.at[tuple(idx)].set(source.astype(self.dtype))


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor, checked=True)
def index_fill(self, dim, index, value):
    d = dim % max(self.ndim, 1)
    size = self.shape[d] if self.ndim else 1
    require_in_range(index, -size, size, BOUNDS, d)
    if self.ndim == 0:
        return jnp.asarray(value, self.dtype).reshape(())
    idx = [slice(None)] * self.ndim
    idx[dim % self.ndim] = index.reshape(-1)
    return self.at[tuple(idx)].set(cast(value, self.dtype))


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def masked_fill(self, mask, value):
    return jnp.where(mask, cast(value, self.dtype), self).astype(self.dtype)


@lowering(aten.masked_scatter.default)
def masked_scatter(self, mask, source):
    shape = jnp.broadcast_shapes(self.shape, mask.shape)
    self = jnp.broadcast_to(self, shape)
    m = jnp.broadcast_to(mask, shape).reshape(-1)
    pos = jnp.cumsum(m) - 1
    src = source.reshape(-1)
    vals = src[jnp.clip(pos, 0, max(src.shape[0] - 1, 0))]
    return jnp.where(m, vals, self.reshape(-1)).reshape(self.shape).astype(self.dtype)


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(self, pad, value=0):
    n = len(pad) // 2
    widths = [(0, 0)] * (self.ndim - n) + [(pad[2 * i], pad[2 * i + 1]) for i in reversed(range(n))]
    lo_hi = [(max(a, 0), max(b, 0)) for a, b in widths]
    out = jnp.pad(self, lo_hi, constant_values=jnp.asarray(value, self.dtype))
    crop = tuple(slice(-a if a < 0 else 0, out.shape[k] + b if b < 0 else out.shape[k])
                 for k, (a, b) in enumerate(widths))
    return out[crop]


@lowering(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default)
def reflection_pad(self, padding):
    n = len(padding) // 2
    widths = [(0, 0)] * (self.ndim - n) + [(padding[2 * i], padding[2 * i + 1]) for i in reversed(range(n))]
    return jnp.pad(self, widths, mode="reflect")


@lowering(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default)
def replication_pad(self, padding):
    n = len(padding) // 2
    widths = [(0, 0)] * (self.ndim - n) + [(padding[2 * i], padding[2 * i + 1]) for i in reversed(range(n))]
    out = jnp.pad(self, [(max(a, 0), max(b, 0)) for a, b in widths], mode="edge")
    crop = tuple(slice(-a if a < 0 else 0, out.shape[k] + b if b < 0 else out.shape[k])
                 for k, (a, b) in enumerate(widths))
    return out[crop]


@lowering(aten.flip.default)
def flip(self, dims):
    return jnp.flip(self, axis=tuple(d % max(self.ndim, 1) for d in dims)) if self.ndim else self


@lowering(aten.roll.default)
def roll(self, shifts, dims=()):
    if not dims:
        return jnp.roll(self.reshape(-1), shifts[0]).reshape(self.shape)
    return jnp.roll(self, tuple(shifts), axis=tuple(dims))


@lowering(aten.tril.default)
def tril(self, diagonal=0):
    return jnp.tril(self, diagonal)


@lowering(aten.triu.default)
def triu(self, diagonal=0):
    return jnp.triu(self, diagonal)


@lowering(aten.repeat.default)
def repeat(self, repeats):
    x = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    return jnp.tile(x, tuple(repeats))


@lowering(aten.sort.default)
def sort(self, dim=-1, descending=False):
    return sort_stable(self, stable=False, dim=dim, descending=descending)


@lowering(aten.sort.stable)
def sort_stable(self, *, stable=None, dim=-1, descending=False):
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = dim % self.ndim
    x = self
    if descending:
        if x.dtype == jnp.bool_:
            key = ~x
        elif jnp.issubdtype(x.dtype, jnp.unsignedinteger):
            key = jnp.iinfo(x.dtype).max - x
        elif jnp.issubdtype(x.dtype, jnp.floating):
            # PyTorch treats NaN as the largest value: first when descending.
            nan = jnp.isnan(x)
            idx = jnp.lexsort((jnp.where(nan, 0, -x), ~nan), axis=d)
            return jnp.take_along_axis(x, idx, axis=d), idx.astype(jnp.int64)
        else:
            key = -x.astype(jnp.int64) if x.dtype != jnp.int64 else -x
    else:
        key = x
    idx = jnp.argsort(key, axis=d, stable=True)
    return jnp.take_along_axis(x, idx, axis=d), idx.astype(jnp.int64)


@lowering(aten.argsort.stable)
def argsort(self, *, stable, dim=-1, descending=False):
    return sort_stable(self, stable=stable, dim=dim, descending=descending)[1]


@lowering(aten.topk.default)
def topk(self, k, dim=-1, largest=True, sorted=True):  # noqa: A002
    if self.ndim == 0:
        return self, jnp.zeros((), jnp.int64)
    d = dim % self.ndim
    vals, idx = sort_stable(self, dim=d, descending=largest)
    return jax.lax.slice_in_dim(vals, 0, k, axis=d), jax.lax.slice_in_dim(idx, 0, k, axis=d)


@lowering(aten.embedding.default, checked=True)
def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    require_in_range(indices, 0, weight.shape[0], OUT_OF_RANGE)
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_dense_backward.default)
def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    flat = indices.reshape(-1)
    g = grad_output.reshape(flat.shape[0], -1)
    if padding_idx >= 0:
        g = jnp.where((flat == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[flat].add(1)
        g = g / counts[flat][:, None]
    acc = jnp.float32 if g.dtype in (jnp.bfloat16, jnp.float16) else g.dtype
    out = jnp.zeros((num_weights, g.shape[1]), acc).at[flat].add(g.astype(acc))
    return out.astype(grad_output.dtype)


@lowering(aten.diag_embed.default)
def diag_embed(self, offset=0, dim1=-2, dim2=-1):
    n = self.shape[-1] + abs(offset)
    idx = jnp.arange(self.shape[-1])
    rows, cols = (idx, idx + offset) if offset >= 0 else (idx - offset, idx)
    out = jnp.zeros(self.shape[:-1] + (n, n), self.dtype).at[..., rows, cols].set(self)
    nd = out.ndim
    d1, d2 = dim1 % nd, dim2 % nd
    if (d1, d2) != (nd - 2, nd - 1):
        out = jnp.moveaxis(out, (nd - 2, nd - 1), (d1, d2))
    return out


@lowering(aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)
def where_scalar(condition, self, other):
    comp, res = promote(KIND.DEFAULT, self, other)
    return jnp.where(condition.astype(bool), cast(self, res), cast(other, res)).astype(res)


@lowering(aten.bucketize.Tensor)
def bucketize(self, boundaries, *, out_int32=False, right=False):
    r = jnp.searchsorted(boundaries, self, side="right" if right else "left")
    return r.astype(jnp.int32 if out_int32 else jnp.int64)


@lowering(aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, self, *, out_int32=False, right=False, side=None, sorter=None):
    s = side or ("right" if right else "left")
    seq = sorted_sequence if sorter is None else jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    if seq.ndim == 1:
        r = jnp.searchsorted(seq, self, side=s)
    else:
        r = jax.vmap(lambda a, v: jnp.searchsorted(a, v, side=s))(seq.reshape(-1, seq.shape[-1]),
                                                                  self.reshape(-1, self.shape[-1]))
        r = r.reshape(self.shape)
    return r.astype(jnp.int32 if out_int32 else jnp.int64)


@lowering(aten.slice_scatter.default)
def slice_scatter(self, src, dim=0, start=None, end=None, step=1):
    d = dim % max(self.ndim, 1)
    idx = [slice(None)] * self.ndim
    idx[d] = slice(start, end, step)
    return self.at[tuple(idx)].set(src.astype(self.dtype))


@lowering(aten.slice_backward.default)
def slice_backward(grad_output, input_sizes, dim, start, end, step):
    """The gradient of a slice: zeros of the input's shape with the slice's gradient in place."""
    return slice_scatter(jnp.zeros(tuple(input_sizes), grad_output.dtype), grad_output, dim, start, end, step)


@lowering(aten.isin.Tensor_Tensor)
def isin(elements, test_elements, *, assume_unique=False, invert=False):
    return jnp.isin(elements, test_elements, invert=invert)


@lowering(aten.select_scatter.default)
def select_scatter(self, src, dim, index):
    d = dim % max(self.ndim, 1)
    idx = [slice(None)] * self.ndim
    idx[d] = index
    return self.at[tuple(idx)].set(src.astype(self.dtype))


@lowering(aten.diagonal_scatter.default)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    d1, d2 = dim1 % self.ndim, dim2 % self.ndim
    x = jnp.moveaxis(self, (d1, d2), (-2, -1))
    n = src.shape[-1]
    i = jnp.arange(n)
    rows, cols = (i, i + offset) if offset >= 0 else (i - offset, i)
    x = x.at[..., rows, cols].set(src.astype(self.dtype))
    return jnp.moveaxis(x, (-2, -1), (d1, d2))


@lowering(aten.as_strided_scatter.default)
def as_strided_scatter(self, src, size, stride, storage_offset=None):
    from tputool.backend.views import strided_write

    flat = strided_write(self.reshape(-1), src, tuple(size), tuple(stride), storage_offset or 0)
    return flat.reshape(self.shape)
