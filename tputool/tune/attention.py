"""The attention implementations the tuner chooses between, in JAX, with SDPA's semantics (one block of
attention is the backend's `attend`, tputool/backend/graph/attention_jax.py).

`plain` materialises the (q_len, k_len) scores. `chunked` walks query blocks with `lax.map`, each block
under `jax.checkpoint`, so the backward recomputes one block at a time and nothing quadratic is saved
(memory-efficient attention over queries; keys are not chunked).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from tputool.backend.graph.attention_jax import attend, attention_scale, expand_kv


def plain_attention(q, k, v, mask=None, causal=False, scale=None):
    """softmax(q k^T * scale [+ mask]) v over (batch, heads, seq, head_dim); kv heads broadcast to q heads."""
    k, v = expand_kv(q, k, v)
    return attend(q, k, v, attention_scale(q.shape[-1], scale), mask, causal).astype(q.dtype)


def chunked_attention(q, k, v, mask=None, causal=False, scale=None, block=128):
    """Same result as plain_attention, computed `block` queries at a time, each block rematerialised."""
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


def sdpa(impl: str, block: int = 128):
    """A lowering of aten.scaled_dot_product_attention using `impl` ('plain' or 'chunked')."""

    def lowering(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if dropout_p:
            raise NotImplementedError("attention dropout is not supported by the tuner's attention lowering")
        if impl == "chunked":
            return chunked_attention(q, k, v, attn_mask, is_causal, scale, block)
        if impl != "plain":
            raise NotImplementedError(f"attention '{impl}' has no lowering here (cost model only)")
        return plain_attention(q, k, v, attn_mask, is_causal, scale)

    return lowering
