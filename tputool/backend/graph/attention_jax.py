"""Scaled dot-product attention in JAX with PyTorch's semantics: the default lowering of `tputool::sdpa` and
the building block of the attention implementations (graph/attention_kernels.py, which also holds its VJP).

Semantics: scores and softmax in float32 (also for bf16/f16 inputs); the value product takes the
probabilities in the value's dtype and accumulates in float32, as PyTorch's fused GPU kernels do (its CPU
math path keeps them in float32; for float32 inputs both are the same); the output in the query's dtype;
`is_causal` top-left aligned (query row i sees keys 0..i); a bool mask keeps True, a float mask is added;
rows with every key masked give zeros; `enable_gqa` repeats each key/value head for its query heads.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

CAUSAL_ROW_BLOCKS = 4
"""Query-row blocks of a causal attention: block i attends keys [0, end of block i) only."""

CAUSAL_MIN_BLOCK_ROWS = 32
"""Shorter row blocks are not worth their extra dots: fewer blocks are used below 4 x 32 rows."""


def attention_scale(head_dim: int, scale: float | None) -> float:
    """SDPA's default scale 1/sqrt(head_dim), unless given."""
    return 1.0 / math.sqrt(head_dim) if scale is None else scale


def expand_kv(q, k, v):
    """k, v with their heads (axis -3) repeated to q's head count (grouped-query attention)."""
    rep = q.shape[-3] // k.shape[-3]
    if rep > 1:
        k, v = jnp.repeat(k, rep, axis=-3), jnp.repeat(v, rep, axis=-3)
    return k, v


def attend(q, k, v, scale: float, mask=None, causal: bool = False, q_offset=0):
    """One block of attention, float32 result: q rows start at query position `q_offset` (for `causal`)."""
    s = jnp.einsum("...qd,...kd->...qk", q, k, preferred_element_type=jnp.float32) * scale
    if causal:
        keep = (q_offset + jnp.arange(s.shape[-2]))[:, None] >= jnp.arange(s.shape[-1])[None, :]
        s = jnp.where(keep, s, -jnp.inf)  # key 0 is always kept: no empty row from the causal mask alone
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf) if mask.dtype == jnp.bool_ else s + mask.astype(jnp.float32)
        empty = jnp.all(jnp.isneginf(s), axis=-1, keepdims=True)
        p = jnp.where(empty, 0.0, jax.nn.softmax(jnp.where(empty, 0.0, s), axis=-1))
    else:
        p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("...qk,...kd->...qd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)


def causal_row_blocks(rows: int) -> list[tuple[int, int]]:
    """[start, stop) of the query-row blocks a causal attention is computed in."""
    n = max(1, min(CAUSAL_ROW_BLOCKS, rows // CAUSAL_MIN_BLOCK_ROWS))
    size = -(-rows // n)
    return [(a, min(a + size, rows)) for a in range(0, rows, size)]


def sdpa_jax(query, key, value, attn_mask, is_causal: bool, scale: float | None, enable_gqa: bool):
    """The lowering of `tputool::sdpa`: causal attention by row blocks (each skips the keys after its last
    row), anything else in one block."""
    if enable_gqa:
        key, value = expand_kv(query, key, value)
    sc = attention_scale(query.shape[-1], scale)
    if not is_causal:
        return attend(query, key, value, sc, mask=attn_mask).astype(query.dtype)
    keys = key.shape[-2]
    outs = [attend(query[..., a:b, :], key[..., :min(b, keys), :], value[..., :min(b, keys), :], sc,
                   causal=True, q_offset=a)
            for a, b in causal_row_blocks(query.shape[-2])]
    return (outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=-2)).astype(query.dtype)
