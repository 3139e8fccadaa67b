"""Attention implementations with SDPA's semantics over (batch, heads, seq, head_dim) JAX arrays: the one place
the backend and the tuner get them from.

- `plain`: the whole (q_len, k_len) score matrix in one block (`attention_jax.attend`);
- `chunked`: `block` query rows at a time under `lax.map`, each block rematerialised in the backward;
- `flash`: JAX's Pallas TPU flash-attention kernel (`jax.experimental.pallas.ops.tpu.flash_attention`),
  all its block sizes set to `block`;
- `splash`: JAX's Pallas TPU splash-attention kernel (forward and backward kernels), block sizes `block`.

The Pallas kernels run natively when the computation is for a TPU (the default backend is a TPU, or inside
`for_tpu_target()`, e.g. compiling for compile-only TPU devices) and in Pallas' interpret mode otherwise (slow:
for checking only). They take no mask: `unsupported` says why a call cannot use a kernel.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp

from tputool.backend import runtime
from tputool.backend.graph.attention_jax import attend, attention_scale, expand_kv, sdpa_jax

IMPLS = ("plain", "chunked", "flash", "splash")
"""Attention implementations by name (the tuner's `attention` knob, tputool-tune.yaml's `attention.impl`)."""

KERNELS = ("flash", "splash")
"""The implementations that are Pallas kernels."""

TPU_LANES = 128
"""The kernels' blocks along the key sequence are multiples of this on a TPU (the vector lane width)."""

_TPU_TARGET: contextvars.ContextVar[bool] = contextvars.ContextVar("tputool_tpu_target", default=False)


@contextlib.contextmanager
def for_tpu_target() -> Iterator[None]:
    """Kernels traced inside are built for a TPU (no interpret mode), whatever this process's devices are."""
    token = _TPU_TARGET.set(True)
    try:
        yield
    finally:
        _TPU_TARGET.reset(token)


def interpret() -> bool:
    """Whether Pallas kernels traced now run in interpret mode (the computation is not for a TPU)."""
    return not _TPU_TARGET.get() and jax.default_backend() != "tpu"


def unsupported(impl: str, block: int, q_len: int, kv_len: int, mask, dtype=None) -> str | None:
    """Why `impl` with `block` cannot compute this attention call (None: it can)."""
    if impl not in IMPLS:
        return f"unknown attention implementation {impl!r} (one of {', '.join(IMPLS)})"
    if impl not in KERNELS:
        return None
    if mask is not None:
        return f"the {impl} kernel takes no attention mask"
    if dtype is not None and jnp.dtype(dtype).itemsize > 4:
        return f"the {impl} kernel takes 16- or 32-bit floats, not {jnp.dtype(dtype).name}"
    if block < 1 or q_len % block or kv_len % block:
        return f"the {impl} kernel's block {block} does not divide the sequence lengths ({q_len}, {kv_len})"
    if block % TPU_LANES and not interpret():
        return f"the {impl} kernel's block {block} is not a multiple of {TPU_LANES} (the TPU lane width)"
    return None


def chunked_attention(q, k, v, mask=None, causal: bool = False, scale: float | None = None, block: int = 128):
    """Same result as plain attention, computed `block` queries at a time, each block rematerialised."""
    scale = attention_scale(q.shape[-1], scale)
    k, v = expand_kv(q, k, v)
    b, h, t, d = q.shape
    if block >= t or t % block:
        block = t if block >= t else math.gcd(t, block)
    n = t // block
    qb = q.reshape(b, h, n, block, d).transpose(2, 0, 1, 3, 4)
    if mask is not None:
        mask = jnp.broadcast_to(mask, (b, h, t, k.shape[2]))
        mb = mask.reshape(b, h, n, block, k.shape[2]).transpose(2, 0, 1, 3, 4)
    else:
        mb = jnp.zeros((n,), q.dtype)

    @jax.checkpoint
    def one(args):
        i, qi, mi = args
        return attend(qi, k, v, scale, mi if mask is not None else None, causal, i * block).astype(q.dtype)

    out = jax.lax.map(one, (jnp.arange(n), qb, mb))
    return out.transpose(1, 2, 0, 3, 4).reshape(b, h, t, d)


def plain_attention(q, k, v, mask=None, causal: bool = False, scale: float | None = None, block: int = 0):
    """softmax(q k^T * scale [+ mask]) v with the whole score matrix; kv heads broadcast to q heads."""
    k, v = expand_kv(q, k, v)
    return attend(q, k, v, attention_scale(q.shape[-1], scale), mask, causal).astype(q.dtype)


@contextlib.contextmanager
def kernel_scope(interpret_mode: bool) -> Iterator[None]:
    """Where a Pallas kernel is traced: 32-bit index arithmetic (the kernels' index maps fail to lower with
    jax_enable_x64, which the backend turns on) and, with `interpret_mode`, Pallas' interpreter."""
    from jax.experimental.pallas import tpu as pltpu

    # `True` rather than TPU InterpretParams: Pallas' plain interpreter (splash's own `interpret=True`), which
    # has no side effects, so the kernel also works under jax.checkpoint (remat)
    mode = pltpu.force_tpu_interpret_mode(True) if interpret_mode else contextlib.nullcontext()  # type: ignore[arg-type]
    with jax.enable_x64(False), mode:
        yield


def _scoped(fn: Callable, interpret_mode: bool) -> Callable:
    """`fn(q, k, v)` with every Pallas call it makes, forward and backward, traced in `kernel_scope`."""

    @jax.custom_vjp
    def run(q, k, v):
        with kernel_scope(interpret_mode):
            return fn(q, k, v)

    def fwd(q, k, v):
        with kernel_scope(interpret_mode):
            return jax.vjp(fn, q, k, v)

    def bwd(vjp, g):
        with kernel_scope(interpret_mode):
            return vjp(g)

    run.defvjp(fwd, bwd)
    return run


def flash_attention(q, k, v, mask=None, causal: bool = False, scale: float | None = None, block: int = 128):
    """Attention through JAX's Pallas TPU flash kernel (no mask; `block` divides both sequence lengths)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    why = unsupported("flash", block, q.shape[-2], k.shape[-2], mask, q.dtype)
    if why:
        raise ValueError(why)
    k, v = expand_kv(q, k, v)
    b = block
    sizes = fa.BlockSizes(block_q=b, block_k_major=b, block_k=b, block_b=1, block_q_major_dkv=b,
                          block_k_major_dkv=b, block_k_dkv=b, block_q_dkv=b, block_k_major_dq=b, block_k_dq=b,
                          block_q_dq=b)
    sm_scale = attention_scale(q.shape[-1], scale)
    # the undecorated function: the public one is a jax.jit whose trace cache ignores the interpret mode
    kernel = functools.partial(fa.flash_attention.__wrapped__, causal=causal, sm_scale=sm_scale, block_sizes=sizes)
    return _scoped(kernel, interpret())(q, k, v).astype(q.dtype)


@functools.lru_cache(maxsize=64)
def _splash_kernel(heads: int, q_len: int, kv_len: int, causal: bool, block: int, interpret_mode: bool) -> Callable:
    """JAX's splash kernel for one shape, mask and block size, over (heads, seq, dim) arrays."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    sizes = sa.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    one = sa.CausalMask((q_len, kv_len)) if causal else sa.FullMask((q_len, kv_len))
    with jax.ensure_compile_time_eval():  # (concrete mask arrays, though built while a computation traces)
        return sa.make_splash_mha_single_device(sa.MultiHeadMask([one] * heads), block_sizes=sizes,
                                                interpret=interpret_mode)


def splash_attention(q, k, v, mask=None, causal: bool = False, scale: float | None = None, block: int = 128):
    """Attention through JAX's Pallas TPU splash kernel (no mask; `block` divides both sequence lengths)."""
    why = unsupported("splash", block, q.shape[-2], k.shape[-2], mask, q.dtype)
    if why:
        raise ValueError(why)
    interpret_mode = interpret()
    kernel = jax.vmap(_splash_kernel(q.shape[1], q.shape[2], k.shape[2], bool(causal), block, interpret_mode))
    k, v = expand_kv(q, k, v)
    sc = attention_scale(q.shape[-1], scale)
    # (the kernel interprets itself off TPU: its own flag, not TPU interpret mode)
    return _scoped(kernel, False)((q * sc).astype(q.dtype), k, v).astype(q.dtype)


def per_device(fn: Callable, mesh, batch_axes: tuple[str, ...], head_axis: str) -> Callable:
    """`fn(q, k, v, mask, causal, scale, block)` (no mask) run per device of `mesh` under `jax.shard_map`
    (XLA cannot partition a Pallas kernel): the batch split over `batch_axes` and the heads over `head_axis`
    where the mesh divides them, replicated otherwise."""
    from jax.sharding import PartitionSpec as P

    def run(q, k, v, mask, causal, scale, block):
        n_batch = math.prod(mesh.shape.get(a, 1) for a in batch_axes)
        t = mesh.shape.get(head_axis, 1)
        batch = batch_axes if n_batch > 1 and q.shape[0] % n_batch == 0 else None
        heads = head_axis if t > 1 and q.shape[1] % t == 0 and k.shape[1] % t == 0 else None
        spec = P(batch, heads, None, None)
        return jax.shard_map(lambda q, k, v: fn(q, k, v, mask, causal, scale, block), mesh=mesh,
                             in_specs=(spec, spec, spec), out_specs=spec, check_vma=False)(q, k, v)

    return run


_BY_NAME: dict[str, Callable] = {"plain": plain_attention, "chunked": chunked_attention,
                                 "flash": flash_attention, "splash": splash_attention}


def attention(impl: str) -> Callable:
    """The implementation named `impl`: `fn(q, k, v, mask=None, causal=False, scale=None, block=...)`."""
    try:
        return _BY_NAME[impl]
    except KeyError:
        raise ValueError(f"unknown attention implementation {impl!r} (one of {', '.join(IMPLS)})") from None


def sdpa_lowering(query, key, value, attn_mask, is_causal: bool, scale: float | None, enable_gqa: bool):
    """The lowering of `tputool::sdpa`: the implementation `runtime.STATE.sdpa_kernel` names (read while the
    graph traces) where it can compute the call, else the default blocked attention (`sdpa_jax`). A Pallas
    kernel runs per device of the tuned config's mesh once `shard_model` has made one."""
    choice = runtime.STATE.sdpa_kernel
    if choice is not None and choice[0] != "plain":
        impl, block, mesh = choice
        if unsupported(impl, block, query.shape[-2], key.shape[-2], attn_mask, query.dtype) is None:
            fn = attention(impl)
            if mesh is not None and impl in KERNELS and mesh.size > 1:
                from tputool.partition import BATCH_AXES

                fn = per_device(fn, mesh, BATCH_AXES, "tensor")
            return fn(query, key, value, attn_mask, is_causal, scale, block)
    return sdpa_jax(query, key, value, attn_mask, is_causal, scale, enable_gqa)


def sdpa_backward_lowering(grad, query, key, value, attn_mask, is_causal: bool, scale: float | None,
                           enable_gqa: bool):
    """The lowering of `tputool::sdpa_backward`: the VJP of `sdpa_lowering`, recomputing the forward."""
    _, vjp = jax.vjp(lambda q, k, v: sdpa_lowering(q, k, v, attn_mask, is_causal, scale, enable_gqa),
                     query, key, value)
    return vjp(grad.astype(query.dtype))
