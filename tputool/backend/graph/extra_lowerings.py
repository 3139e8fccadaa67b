"""Lowerings that compiled graphs need beyond the shared table.

Two tables, kept as data:
- `GRAPH_ONLY`: view ops (view, permute, expand, slice, ...) lowered as functional values. In a
  functionalized graph a view is just a new value; eager dispatch must never see these (a tpu view shares
  its storage), so they live outside LOWERINGS and only `graph_table()` adds them.
- `SHARED`: ops the shared table may lack (embedding, cat, gather/scatter/index_put, topk/sort, convolution
  and its backward, max_pool2d with indices, layer norm, dropout); used for graphs only where LOWERINGS has
  no entry, so eager dispatch is never changed by graph mode.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import torch
from jax import lax

from tputool.backend.graph.attention import GRAPH_LOWERINGS as ATTENTION
from tputool.backend.lowerings import LOWERINGS, Lowering

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


GRAPH_ONLY: dict = {
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
}
"""View ops as functional values (graph mode only); wrapped into `Lowering`s by `graph_table()`."""


# ---- ops shared with eager -------------------------------------------------------------------------

def _slice_scatter(x, src, dim=0, start=None, end=None, step=1):
    dim = _dim(dim, x.ndim)
    return x.at[(slice(None),) * dim + (slice(start, end, step),)].set(src.astype(x.dtype))


def _select_scatter(x, src, dim, index):
    dim = _dim(dim, x.ndim)
    return x.at[(slice(None),) * dim + (index,)].set(src.astype(x.dtype))


def _cat(tensors, dim=0):
    ts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)] or list(tensors[:1])
    return jnp.concatenate(ts, axis=_dim(dim, ts[0].ndim))


def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return jnp.take(weight, indices, axis=0)


def _embedding_dense_backward(grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    d = grad.shape[-1]
    flat = indices.reshape(-1)
    g = grad.reshape(-1, d)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[flat].add(1)
        g = g / counts[flat][:, None]
    if padding_idx >= 0:
        g = jnp.where((flat == padding_idx)[:, None], 0, g)
    return jnp.zeros((num_weights, d), grad.dtype).at[flat].add(g)


def _full_index(index, dim):
    idx = [lax.broadcasted_iota(jnp.int64 if index.dtype == jnp.int64 else jnp.int32, index.shape, d)
           for d in range(index.ndim)]
    idx[dim] = index
    return tuple(idx)


def _gather(x, dim, index, sparse_grad=False):
    dim = _dim(dim, x.ndim)
    return x[_full_index(index, dim)]


def _scatter_src(x, dim, index, src):
    dim = _dim(dim, x.ndim)
    src = src[tuple(slice(0, s) for s in index.shape)]
    return x.at[_full_index(index, dim)].set(src.astype(x.dtype))


def _scatter_value(x, dim, index, value):
    return x.at[_full_index(index, _dim(dim, x.ndim))].set(jnp.asarray(value, x.dtype))


def _scatter_add(x, dim, index, src):
    dim = _dim(dim, x.ndim)
    src = src[tuple(slice(0, s) for s in index.shape)]
    return x.at[_full_index(index, dim)].add(src.astype(x.dtype))


def _index_key(indices):
    return tuple(slice(None) if i is None else i for i in indices)


def _index(x, indices):
    return x[_index_key(indices)]


def _index_put(x, indices, values, accumulate=False):
    ref = x.at[_index_key(indices)]
    values = values.astype(x.dtype)
    return ref.add(values) if accumulate else ref.set(values)


def _index_select(x, dim, index):
    return jnp.take(x, index.reshape(-1), axis=_dim(dim, x.ndim)) if index.ndim else jnp.take(
        x, index.reshape(1), axis=_dim(dim, x.ndim))


def _topk(x, k, dim=-1, largest=True, sorted=True):
    dim = _dim(dim, x.ndim) if x.ndim else 0
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    moved = jnp.moveaxis(x, dim, -1)
    vals, idx = lax.top_k(moved if largest else -moved, k)
    vals = vals if largest else -vals
    return jnp.moveaxis(vals, -1, dim), jnp.moveaxis(idx.astype(jnp.int64), -1, dim)


def _sort(x, dim=-1, descending=False):
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    dim = _dim(dim, x.ndim)
    idx = jnp.argsort(-x if descending else x, axis=dim, stable=True)
    return jnp.take_along_axis(x, idx, axis=dim), idx.astype(jnp.int64)


def _sort_stable(x, *, stable=None, dim=-1, descending=False):
    return _sort(x, dim, descending)


def _conv_dims(n: int) -> lax.ConvDimensionNumbers:
    sp = "DHW"[-n:] if n <= 3 else None
    return lax.conv_dimension_numbers((1, 1) + (1,) * n, (1, 1) + (1,) * n, ("NC" + sp, "OI" + sp, "NC" + sp))


def _convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    n = x.ndim - 2
    stride, dilation = list(stride) * (n // len(stride)), list(dilation) * (n // len(dilation))
    padding = list(padding) * (n // len(padding))
    dn = _conv_dims(n)
    if not transposed:
        out = lax.conv_general_dilated(x, w, stride, [(p, p) for p in padding], rhs_dilation=dilation,
                                       dimension_numbers=dn, feature_group_count=groups)
    else:
        # w: (Cin, Cout/groups, *k) -> (Cout, Cin/groups, *k), spatially flipped
        cin, cog = w.shape[0], w.shape[1]
        k = w.shape[2:]
        wg = w.reshape((groups, cin // groups, cog) + k)
        wg = jnp.swapaxes(wg, 1, 2).reshape((groups * cog, cin // groups) + k)
        wg = jnp.flip(wg, axis=tuple(range(2, 2 + n)))
        output_padding = list(output_padding) * (n // max(len(output_padding), 1)) if output_padding else [0] * n
        pads = [(dilation[i] * (k[i] - 1) - padding[i], dilation[i] * (k[i] - 1) - padding[i] + output_padding[i])
                for i in range(n)]
        out = lax.conv_general_dilated(x, wg, [1] * n, pads, lhs_dilation=stride, rhs_dilation=dilation,
                                       dimension_numbers=dn, feature_group_count=groups)
    if bias is not None:
        out = out + bias.reshape((1, -1) + (1,) * n)
    return out


def _convolution_backward(grad, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
                          output_mask):
    def f(x_, w_):
        return _convolution(x_, w_, None, stride, padding, dilation, transposed, output_padding, groups)

    _, vjp = jax.vjp(f, x, w)
    gx, gw = vjp(grad.astype(x.dtype))
    gb = jnp.sum(grad, axis=(0, *range(2, grad.ndim)))
    return gx, gw, gb  # all three, whatever output_mask says: unused ones are dead code to XLA


def _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode):
    n = 2
    k = list(kernel_size) * (n // len(kernel_size))
    s = list(stride) * (n // len(stride)) if stride else k
    p = list(padding) * (n // len(padding))
    d = list(dilation) * (n // len(dilation))
    pads = []
    for i in range(n):
        size = x.shape[-n + i]
        eff = d[i] * (k[i] - 1) + 1
        num = size + 2 * p[i] - eff
        out = (-(-num // s[i]) if ceil_mode else num // s[i]) + 1
        if ceil_mode and (out - 1) * s[i] >= size + p[i]:
            out -= 1
        hi = (out - 1) * s[i] + eff - size - p[i]
        pads.append((p[i], max(hi, p[i])))
    return k, s, d, pads


def _max_pool2d_with_indices(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
    k, s, d, pads = _pool_geometry(x, kernel_size, stride, padding, dilation, ceil_mode)
    h, w = x.shape[-2:]
    lead = x.shape[:-2]
    idx = jnp.broadcast_to(jnp.arange(h * w, dtype=jnp.int64).reshape(h, w), x.shape)
    init_v = jnp.array(-jnp.inf, x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.array(
        jnp.iinfo(x.dtype).min, x.dtype)

    def pick(a, b):
        (av, ai), (bv, bi) = a, b
        take_b = (bv > av) | ((bv == av) & (bi < ai) & (ai >= 0)) | (ai < 0) | jnp.isnan(bv)
        return jnp.where(take_b, bv, av), jnp.where(take_b, bi, ai)

    dims = (1,) * len(lead) + tuple(k)
    strides = (1,) * len(lead) + tuple(s)
    dil = (1,) * len(lead) + tuple(d)
    full_pads = [(0, 0)] * len(lead) + pads
    vals, inds = lax.reduce_window((x, idx), (init_v, jnp.array(-1, jnp.int64)), pick, dims, strides, full_pads,
                                   window_dilation=dil)
    return vals, inds


def _max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
    h, w = x.shape[-2:]
    lead = x.shape[:-2]
    g = grad.reshape((math.prod(lead), -1))
    i = indices.reshape((math.prod(lead), -1))
    rows = jnp.broadcast_to(jnp.arange(g.shape[0])[:, None], i.shape)
    out = jnp.zeros((g.shape[0], h * w), grad.dtype).at[rows, i].add(g)
    return out.reshape(x.shape)


def _native_layer_norm(x, normalized_shape, weight, bias, eps):
    axes = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = x.astype(jnp.float32) if x.dtype in (jnp.float16, jnp.bfloat16) else x
    mean = jnp.mean(xf, axis=axes, keepdims=True)
    var = jnp.mean(jnp.square(xf - mean), axis=axes, keepdims=True)
    rstd = lax.rsqrt(var + eps)
    out = ((xf - mean) * rstd).astype(x.dtype)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out, mean.astype(x.dtype), rstd.astype(x.dtype)


def _native_dropout(x, p, train, rng_key=None):
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    keep = jax.random.bernoulli(rng_key, 1.0 - p, x.shape)
    return jnp.where(keep, x / (1.0 - p), 0).astype(x.dtype), keep


def _constant_pad_nd(x, pad, value=0):
    cfg = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        cfg[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return lax.pad(x, jnp.asarray(value, x.dtype), cfg)


SHARED: dict = {
    aten.slice_scatter.default: _slice_scatter,
    aten.select_scatter.default: _select_scatter,
    aten.cat.default: _cat,
    aten.embedding.default: _embedding,
    aten.embedding_dense_backward.default: _embedding_dense_backward,
    aten.gather.default: _gather,
    aten.scatter.src: _scatter_src,
    aten.scatter.value: _scatter_value,
    aten.scatter_add.default: _scatter_add,
    aten.index.Tensor: _index,
    aten.index_put.default: _index_put,
    aten.index_select.default: _index_select,
    aten.topk.default: _topk,
    aten.sort.default: _sort,
    aten.sort.stable: _sort_stable,
    aten.convolution.default: _convolution,
    aten.convolution_backward.default: _convolution_backward,
    aten.max_pool2d_with_indices.default: _max_pool2d_with_indices,
    aten.max_pool2d_with_indices_backward.default: _max_pool2d_with_indices_backward,
    aten.native_layer_norm.default: _native_layer_norm,
    aten.constant_pad_nd.default: _constant_pad_nd,
}
"""Ops added to the graph table when the shared table lacks them."""

SHARED_RNG: dict = {
    aten.native_dropout.default: _native_dropout,
}
"""Random ops (take `rng_key`) added to the graph table when missing."""


# ---- foreach ops (graph only: eager keeps PyTorch's own per-tensor loops) -----------------------------

FOREACH_BASE_OVERLOAD: dict[str, tuple[str, ...]] = {
    "List": ("Tensor", "default"), "Scalar": ("Scalar", "Tensor", "default"), "ScalarList": ("Scalar", "Tensor", "default"),
    "Tensor": ("Tensor",), "default": ("default",), "ScalarAndTensor": ("Scalar",),
}
"""`_foreach_<op>.<overload>` -> overloads of `<op>` tried in order, applied per list element."""

FOREACH_SPECIAL: dict[str, tuple] = {
    "norm": (aten.linalg_vector_norm.default, lambda x, ord=2, dtype=None: ((x, ord, None, False), {"dtype": dtype})),
}
"""Foreach ops whose base has different arguments: name -> (base op, per-element argument builder)."""


def _foreach_lowering(op: torch._ops.OpOverload, table: dict) -> Lowering | None:
    name = op.overloadpacket.__name__[len("_foreach_"):]
    if name.endswith("_") or any(a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments):
        return None
    if name in FOREACH_SPECIAL:
        base, build = FOREACH_SPECIAL[name]
        if base not in table:
            return None
        fn = table[base].fn

        def special(*args, **kwargs):
            return tuple(fn(*a, **k) for a, k in (build(x, *args[1:], **kwargs) for x in args[0]))

        return Lowering(special)
    pkt = getattr(aten, name, None)
    base = None
    for ov in FOREACH_BASE_OVERLOAD.get(op._overloadname, ()):
        cand = getattr(pkt, ov, None) if pkt is not None else None
        if cand is not None and cand in table:
            base = cand
            break
    if base is None:
        return None
    fn = table[base].fn
    per_element = [isinstance(a.type, torch._C.ListType) for a in op._schema.arguments if not a.kwarg_only]
    base_args = [(a.name, a.kwarg_only) for a in base._schema.arguments]

    def call(vals, kwargs):
        pos, kw = [], dict(kwargs)
        for v, (name, kwarg_only) in zip(vals, base_args, strict=False):
            if kwarg_only:
                kw[name] = v
            else:
                pos.append(v)
        return fn(*pos, **kw)

    def apply(*args, **kwargs):
        n = next(len(a) for a, listy in zip(args, per_element, strict=False) if listy)
        return tuple(call([a[i] if listy else a for a, listy in zip(args, per_element, strict=False)], kwargs)
                     for i in range(n))

    return Lowering(apply)


def foreach_lowerings(table: dict) -> dict:
    """Lowerings for every functional `aten._foreach_*` op whose per-element op is in `table`."""
    out = {}
    for pname in dir(aten):
        if not pname.startswith("_foreach_"):
            continue
        pkt = getattr(aten, pname)
        for ov in pkt.overloads():
            op = getattr(pkt, ov)
            low = _foreach_lowering(op, table)
            if low is not None:
                out[op] = low
    return out


def missing_shared() -> dict:
    """SHARED/SHARED_RNG entries for ops the shared table lacks (used by graphs only, never by eager)."""
    out = {}
    for table, rng in ((SHARED, False), (SHARED_RNG, True), (ATTENTION, False)):
        for op, fn in table.items():
            if op not in LOWERINGS:
                out[op] = Lowering(fn, rng)
    return out


def graph_table() -> dict[torch._ops.OpOverload, Lowering]:
    """The table compiled graphs use: LOWERINGS, plus foreach ops, GRAPH_ONLY views and missing SHARED ops."""
    return {**foreach_lowerings(LOWERINGS), **{op: Lowering(fn) for op, fn in GRAPH_ONLY.items()},
            **missing_shared(), **LOWERINGS}


_cached: tuple[int, dict] | None = None


def cached_graph_table() -> dict:
    """`graph_table()`, rebuilt only when LOWERINGS has changed size."""
    global _cached
    if _cached is None or _cached[0] != len(LOWERINGS):
        table = graph_table()
        _cached = (len(LOWERINGS), table)
    return _cached[1]
