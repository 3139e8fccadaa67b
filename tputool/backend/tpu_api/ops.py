"""`torch.tpu.ops`: TorchTPU's kernels and collectives, on tpu tensors.

- `splash_sdpa`: attention through JAX's Pallas TPU splash-attention kernel (forward and backward kernels);
  where the device is not a TPU, the same kernel runs in Pallas' interpret mode (slow, for checking only).
- `grouped_matmul`: a grouped matmul (MoE experts) through `jax.lax.ragged_dot` or JAX's Pallas megablox kernels
  (interpret mode off TPU); on CPU tensors, a plain torch loop (the reference).
- `moe_experts`: the sparse mixture-of-experts expert layer (sort by expert, three grouped matmuls, combine) as
  one op, per device of the tuned config's mesh (`graph/moe_experts.py`); on CPU tensors, a torch loop.
- `ragged_dot`, `ragged_dot_weight_grad`: grouped matmuls through `jax.lax.ragged_dot` (and its VJP).
- `all_gather_dim`, `reduce_scatter_dim`: collectives along a tensor dimension over a process group (the
  tpu group across processes; world size 1: a copy).
- `optimization_barrier`: `jax.lax.optimization_barrier` over tensors.
- `max_pool1d/2d/3d` and their `_backward`: max pooling (PyTorch's semantics) in JAX and its VJP.
The rest of TorchTPU's list raises NotImplementedError saying why (SparseCore hardware, point-to-point
transfers between processes, jagged layouts).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tputool.backend.tpu_api.pallas import jax_op

__all__ = ["align_jagged_to_multiple", "all_gather_dim", "grouped_matmul", "max_pool1d", "max_pool1d_backward", "max_pool2d",
           "max_pool2d_backward", "max_pool3d", "max_pool3d_backward", "moe_experts", "optimization_barrier",
           "ragged_all_to_all", "ragged_dot", "ragged_dot_weight_grad", "recv", "reduce_scatter_dim", "send",
           "sparse_dense_matmul", "sparse_gather", "sparse_iota", "sparse_map_row", "splash_sdpa",
           "strip_jagged_padding"]

SPLASH_BLOCK = 128
"""Block size of the splash kernel along both sequences (the TPU lane width: its minimum)."""


# ---- attention -----------------------------------------------------------------------------------------

def _splash_attention(q, k, v, *, causal: bool, scale: float):
    """(batch, heads, seq, dim) attention through the splash kernel (graph/attention_kernels.py)."""
    from tputool.backend.graph.attention_kernels import splash_attention

    return splash_attention(q, k, v, None, causal, scale, SPLASH_BLOCK)


def splash_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, is_causal: bool = False,
                scale: float | None = None) -> torch.Tensor:
    """Attention as F.scaled_dot_product_attention (no mask, no dropout) through the Pallas splash kernel.

    Shapes (batch, heads, seq, head_dim); key/value heads may divide the query heads (grouped-query); both
    sequence lengths must be multiples of 128 (the kernel's block)."""
    if query.dim() != 4 or key.dim() != 4 or value.dim() != 4:
        raise ValueError("splash_sdpa takes (batch, heads, seq, head_dim) query, key and value")
    q_len, kv_len, heads = query.shape[-2], key.shape[-2], query.shape[1]
    if q_len % SPLASH_BLOCK or kv_len % SPLASH_BLOCK:
        raise ValueError(f"splash_sdpa: sequence lengths must be multiples of {SPLASH_BLOCK} (the splash kernel's "
                         f"block), got query {q_len} and key {kv_len}; pad them or use "
                         "F.scaled_dot_product_attention")
    if heads % key.shape[1]:
        raise ValueError(f"splash_sdpa: key heads ({key.shape[1]}) must divide query heads ({heads})")
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else float(scale)
    return jax_op(_splash_attention, query, key, value, causal=bool(is_causal), scale=scale)


# ---- grouped matmuls -------------------------------------------------------------------------------------

def _grouped_matmul_reference(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """The grouped matmul as a torch loop over the groups (CPU tensors; differentiable by torch)."""
    dtype = torch.promote_types(lhs.dtype, rhs.dtype)
    parts, start = [], 0
    for i, size in enumerate(group_sizes.tolist()):
        parts.append(lhs[start:start + size].to(dtype) @ rhs[i].to(dtype))
        start += size
    parts.append(lhs.new_zeros((lhs.shape[0] - start, rhs.shape[-1]), dtype=dtype))
    return torch.cat(parts)


def grouped_matmul(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor, *,
                   impl: str = "ragged") -> torch.Tensor:
    """Grouped matmul (MoE experts): the rows of `lhs` (m, k) in consecutive groups of `group_sizes` (g,) rows
    (total at most m), group i times `rhs[i]` (g, k, n) -> (m, n); rows past the groups' total are zero
    (jax.lax.ragged_dot's contract). `impl`: "ragged" (jax.lax.ragged_dot) or "gmm" (the Pallas megablox
    kernels; interpret mode off TPU). Differentiable in lhs and rhs; on CPU tensors, a torch loop."""
    from tputool.backend.graph import grouped_matmul as gm

    if impl not in gm.IMPLS:
        raise ValueError(f"grouped_matmul: unknown impl {impl!r} (one of {', '.join(gm.IMPLS)})")
    if lhs.dim() != 2 or rhs.dim() != 3 or group_sizes.dim() != 1 or lhs.shape[1] != rhs.shape[1] \
            or group_sizes.shape[0] != rhs.shape[0]:
        raise ValueError(f"grouped_matmul takes lhs (m, k), rhs (g, k, n) and group_sizes (g,), got "
                         f"{tuple(lhs.shape)}, {tuple(rhs.shape)} and {tuple(group_sizes.shape)}")
    if lhs.device.type == "cpu" and not torch.compiler.is_compiling():
        return _grouped_matmul_reference(lhs, rhs, group_sizes)
    return jax_op(gm.run, lhs, rhs, group_sizes, impl=impl)


def _moe_experts_reference(x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor, w1: torch.Tensor,
                           w3: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The sparse expert layer with torch ops and the grouped matmul's torch loop (CPU tensors)."""
    k, dim = top_i.shape[-1], x.shape[-1]
    xf = x.reshape(-1, dim)
    assigned = top_i.reshape(-1)
    order = torch.argsort(assigned, stable=True)
    rows = xf[order // k]
    sizes = torch.bincount(assigned, minlength=w1.shape[0])
    gate, up = (_grouped_matmul_reference(rows, w, sizes) for w in (w1, w3))
    h = torch.nn.functional.silu(gate) * up
    y = _grouped_matmul_reference(h, w2, sizes)[torch.argsort(order)]
    return (y.reshape(-1, k, dim) * top_w.reshape(-1, k, 1)).sum(1).reshape(x.shape)


def moe_experts(x: torch.Tensor, top_w: torch.Tensor, top_i: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                w2: torch.Tensor, *, impl: str = "ragged") -> torch.Tensor:
    """Sparse mixture-of-experts SwiGLU experts: each token of `x` (batch, ..., dim) goes to its experts `top_i`
    (batch, ..., k), weighted by `top_w` (same shape); expert e computes (silu(x @ w1[e]) * (x @ w3[e])) @ w2[e]
    (w1, w3: (experts, dim, ffn); w2: (experts, ffn, dim)). Runs as one op: rows sorted by expert, grouped
    matmuls `impl` ("ragged" or "gmm", as grouped_matmul), summed back per token; per device of the active
    tuned config's mesh once its `shard_model` made one. Differentiable in x, top_w and the weights."""
    from tputool.backend.graph import grouped_matmul as gm
    from tputool.backend.graph import moe_experts as me

    if impl not in gm.IMPLS:
        raise ValueError(f"moe_experts: unknown impl {impl!r} (one of {', '.join(gm.IMPLS)})")
    n, dim, ffn = w1.shape
    if x.shape[-1] != dim or top_w.shape != top_i.shape or top_i.shape[:-1] != x.shape[:-1] \
            or w3.shape != w1.shape or tuple(w2.shape) != (n, ffn, dim):
        raise ValueError(f"moe_experts takes x (..., dim), top_w and top_i (..., k), w1 and w3 (experts, dim, ffn) "
                         f"and w2 (experts, ffn, dim), got {tuple(x.shape)}, {tuple(top_w.shape)}, "
                         f"{tuple(top_i.shape)}, {tuple(w1.shape)}, {tuple(w3.shape)} and {tuple(w2.shape)}")
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        return _moe_experts_reference(x, top_w, top_i, w1, w3, w2)
    return jax_op(me.experts, x, top_w, top_i, w1, w3, w2, impl=impl)


def _ragged_dot(lhs, rhs, group_sizes):
    return jax.lax.ragged_dot(lhs, rhs, group_sizes.astype(jnp.int32))


def ragged_dot(lhs: torch.Tensor, rhs: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """Grouped matmul: rows of `lhs` (m, k) in consecutive groups of `group_sizes` (g,), group i times
    `rhs[i]` (g, k, n) -> (m, n); rows past the groups' total are zero. Differentiable in lhs and rhs."""
    return jax_op(_ragged_dot, lhs, rhs, group_sizes)


def _ragged_dot_weight_grad(lhs, grad, group_sizes, k: int, n: int):
    zeros = jnp.zeros((group_sizes.shape[0], k, n), grad.dtype)
    _, vjp = jax.vjp(lambda w: _ragged_dot(lhs, w, group_sizes), zeros)
    return vjp(grad)[0]


def ragged_dot_weight_grad(lhs: torch.Tensor, grad_output: torch.Tensor, group_sizes: torch.Tensor) -> torch.Tensor:
    """The gradient of ragged_dot's `rhs`: for each group i, lhs_i^T @ grad_output_i -> (g, k, n)."""
    return jax_op(_ragged_dot_weight_grad, lhs, grad_output, group_sizes, k=lhs.shape[-1], n=grad_output.shape[-1])


# ---- collectives -----------------------------------------------------------------------------------------

def _world_size(group) -> int:
    import torch.distributed as dist

    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def all_gather_dim(tensor: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Every rank's `tensor`, concatenated along `dim` in rank order (one process: a copy of `tensor`)."""
    import torch.distributed as dist

    n = _world_size(group)
    if n == 1:
        return tensor.clone()
    x = tensor.movedim(dim, 0).contiguous()
    out = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x, group=group)
    return out.movedim(0, dim)


def reduce_scatter_dim(tensor: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """The sum over ranks of `tensor`, split along `dim` into world-size parts: this rank's part (one
    process: a copy)."""
    import torch.distributed as dist

    n = _world_size(group)
    if n == 1:
        return tensor.clone()
    if tensor.shape[dim] % n:
        raise ValueError(f"torch.tpu.ops.reduce_scatter_dim: dimension {dim} of size {tensor.shape[dim]} does not "
                         f"split into {n} equal parts")
    x = tensor.movedim(dim, 0).contiguous()
    out = torch.empty((x.shape[0] // n, *x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x, group=group)
    return out.movedim(0, dim)


def _barrier(*arrays):
    return jax.lax.optimization_barrier(arrays)


def optimization_barrier(tensors: torch.Tensor | Sequence[torch.Tensor]):
    """The same values, through jax.lax.optimization_barrier (XLA does not move computation across it)."""
    if isinstance(tensors, torch.Tensor):
        return jax_op(_barrier, tensors)[0]
    out = jax_op(_barrier, *tensors)
    return list(out) if isinstance(tensors, list) else tuple(out)


# ---- max pooling -----------------------------------------------------------------------------------------

def _tuple(v, n: int, name: str) -> tuple[int, ...]:
    t = (int(v),) * n if isinstance(v, int) else tuple(int(x) for x in v)
    if len(t) == 1 and n > 1:
        t = t * n
    if len(t) != n:
        raise ValueError(f"max_pool{n}d: {name} must be an int or {n} ints, got {v!r}")
    return t


def _pool_args(n: int, kernel_size, stride, padding, dilation) -> dict:
    k = _tuple(kernel_size, n, "kernel_size")
    s = k if stride is None or (not isinstance(stride, int) and len(stride) == 0) else _tuple(stride, n, "stride")
    p, d = _tuple(padding, n, "padding"), _tuple(dilation, n, "dilation")
    if any(2 * pi > ki for pi, ki in zip(p, k, strict=True)):
        raise ValueError(f"max_pool{n}d: padding {p} must be at most half of kernel_size {k}")
    return {"kernel": k, "stride": s, "padding": p, "dilation": d}


def _pool(x, kernel: tuple, stride: tuple, padding: tuple, dilation: tuple, ceil_mode: bool):
    """PyTorch's max pooling over the last len(kernel) axes (implicit -inf padding): the window elements are
    strided slices, stacked, and the first maximum is taken (so its gradient goes to that element, as in
    PyTorch, also for ties and dilated windows)."""
    lead = x.ndim - len(kernel)
    pads, outs = [(0, 0)] * lead, []
    for size, k, s, p, d in zip(x.shape[lead:], kernel, stride, padding, dilation, strict=True):
        span = d * (k - 1) + 1
        num = size + 2 * p - span
        out = (-(-num // s) if ceil_mode else num // s) + 1
        if ceil_mode and (out - 1) * s >= size + p:
            out -= 1
        pads.append((p, max(0, (out - 1) * s + span - size - p)))
        outs.append(out)
    low = -np.inf if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.iinfo(x.dtype).min
    xp = jnp.pad(x, pads, constant_values=np.array(low, x.dtype))
    parts = []
    for offs in itertools.product(*(range(k) for k in kernel)):
        starts = (0,) * lead + tuple(o * d for o, d in zip(offs, dilation, strict=True))
        limits = x.shape[:lead] + tuple(st + (n - 1) * s + 1 for st, n, s in
                                        zip(starts[lead:], outs, stride, strict=True))
        parts.append(jax.lax.slice(xp, starts, limits, (1,) * lead + stride))
    stacked = jnp.stack(parts, axis=-1)
    first = jnp.argmax(stacked, axis=-1, keepdims=True)
    return jnp.take_along_axis(stacked, first, axis=-1)[..., 0]


def _pool_backward(grad, x, **kw):
    _, vjp = jax.vjp(functools.partial(_pool, **kw), x)
    return vjp(grad.astype(x.dtype))[0]


def _max_pool(n: int) -> tuple[Callable, Callable]:
    def forward(input: torch.Tensor, kernel_size, stride=None, padding=0, dilation=1,  # noqa: A002 - F's name
                ceil_mode: bool = False) -> torch.Tensor:
        return jax_op(_pool, input, **_pool_args(n, kernel_size, stride, padding, dilation),
                      ceil_mode=bool(ceil_mode))

    def backward(grad_output: torch.Tensor, input: torch.Tensor, kernel_size, stride=None,  # noqa: A002
                 padding=0, dilation=1, ceil_mode: bool = False) -> torch.Tensor:
        return jax_op(_pool_backward, grad_output, input, **_pool_args(n, kernel_size, stride, padding, dilation),
                      ceil_mode=bool(ceil_mode))

    forward.__name__, backward.__name__ = f"max_pool{n}d", f"max_pool{n}d_backward"
    forward.__doc__ = f"F.max_pool{n}d (without indices) as one JAX reduce_window; differentiable."
    backward.__doc__ = f"The gradient of max_pool{n}d's input for `grad_output` (the VJP of the pooling)."
    return forward, backward


max_pool1d, max_pool1d_backward = _max_pool(1)
max_pool2d, max_pool2d_backward = _max_pool(2)
max_pool3d, max_pool3d_backward = _max_pool(3)


# ---- names without a meaning here --------------------------------------------------------------------------

def _unavailable(name: str, reason: str) -> Callable:
    def op(*args, **kwargs):
        raise NotImplementedError(f"torch.tpu.ops.{name} is not available in tputool's bundled backend: {reason}")

    op.__name__ = name
    op.__doc__ = f"Not available here: {reason}"
    return op


_SPARSECORE = ("it runs on the TPU's SparseCore (the embedding units of v5p/v6e/v7x chips), which has no "
               "counterpart off TPU; use torch.nn.functional.embedding / embedding_bag or torch.sparse")
sparse_dense_matmul = _unavailable("sparse_dense_matmul", _SPARSECORE)
sparse_gather = _unavailable("sparse_gather", _SPARSECORE)
sparse_iota = _unavailable("sparse_iota", _SPARSECORE)
sparse_map_row = _unavailable("sparse_map_row", _SPARSECORE)
_P2P = ("it moves data between processes, and the bundled backend runs one process (world size 1): "
        "multi-process collectives are not implemented yet")
send = _unavailable("send", _P2P)
recv = _unavailable("recv", _P2P)
ragged_all_to_all = _unavailable("ragged_all_to_all", _P2P)
_JAGGED = ("TorchTPU's jagged (packed variable-length) layout helpers are not reproduced; pad with "
           "torch.nn.utils.rnn.pad_sequence and slice instead")
align_jagged_to_multiple = _unavailable("align_jagged_to_multiple", _JAGGED)
strip_jagged_padding = _unavailable("strip_jagged_padding", _JAGGED)
