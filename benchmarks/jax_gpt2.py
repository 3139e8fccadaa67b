"""The reference: `benchmarks/target/train_gpt2.py`'s GPT-2 written directly in JAX (same config and math):
pre-LayerNorm blocks, causal attention, tanh GELU, tied embeddings, cross-entropy, global-norm clipping at 1.0
and AdamW (betas 0.9/0.95, weight decay 0.1 on matrices) in one `jax.jit` step, parameters and optimizer state
donated. `compiled_peak_bytes` compiles that step for one device of a TPU topology (nothing runs)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

Params = dict[str, Any]


def param_shapes(n_layer: int, d: int, vocab: int, block: int) -> Params:
    """Shapes (ShapeDtypeStruct, float32) of the model's parameters."""
    f = jnp.float32

    def s(*shape: int) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, f)

    layer = {"ln_1": (s(d), s(d)), "ln_2": (s(d), s(d)), "c_attn": (s(d, 3 * d), s(3 * d)),
             "c_proj": (s(d, d), s(d)), "c_fc": (s(d, 4 * d), s(4 * d)), "mlp_proj": (s(4 * d, d), s(d))}
    return {"wte": s(vocab, d), "wpe": s(block, d), "ln_f": (s(d), s(d)), "h": [layer] * n_layer}


def _ln(x: jax.Array, p: tuple) -> jax.Array:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + 1e-5) * p[0] + p[1]


def _block(lp: Params, x: jax.Array, heads: int) -> jax.Array:
    b, t, d = x.shape
    qkv = _ln(x, lp["ln_1"]) @ lp["c_attn"][0] + lp["c_attn"][1]
    q, k, v = (z.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for z in jnp.split(qkv, 3, axis=-1))
    scores = (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(d // heads).astype(x.dtype)
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
    y = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + y @ lp["c_proj"][0] + lp["c_proj"][1]
    h = jax.nn.gelu(_ln(x, lp["ln_2"]) @ lp["c_fc"][0] + lp["c_fc"][1], approximate=True)
    return x + h @ lp["mlp_proj"][0] + lp["mlp_proj"][1]


def loss_fn(params: Params, idx: jax.Array, targets: jax.Array, heads: int) -> jax.Array:
    """Mean cross-entropy of the next tokens."""
    x = params["wte"][idx] + params["wpe"][: idx.shape[1]]
    for lp in params["h"]:
        x = _block(lp, x, heads)
    logits = _ln(x, params["ln_f"]) @ params["wte"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def train_step(params: Params, opt: tuple, idx: jax.Array, targets: jax.Array, heads: int):
    """Forward, backward, clip to global norm 1.0, AdamW; returns new params, new state, loss."""
    loss, grads = jax.value_and_grad(loss_fn)(params, idx, targets, heads)
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    grads = jax.tree.map(lambda g: g * jnp.minimum(1.0, 1.0 / (norm + 1e-6)), grads)
    m, v, step = opt
    step = step + 1
    m = jax.tree.map(lambda a, g: 0.9 * a + 0.1 * g, m, grads)
    v = jax.tree.map(lambda a, g: 0.95 * a + 0.05 * g * g, v, grads)
    c1, c2 = 1 - 0.9 ** step, 1 - 0.95 ** step

    def update(w, a, b):
        decay = 0.1 if w.ndim >= 2 else 0.0
        return w * (1 - 6e-4 * decay) - 6e-4 * (a / c1) / (jnp.sqrt(b / c2) + 1e-8)

    return jax.tree.map(update, params, m, v), (m, v, step), loss


def compiled_peak_bytes(device, batch: int, n_layer: int = 12, n_head: int = 12, d: int = 768,
                        vocab: int = 50304, block: int = 1024) -> int:
    """XLA's peak bytes (arguments + outputs + temporaries - aliased) of one step compiled for `device`."""
    from functools import partial

    from jax.sharding import SingleDeviceSharding

    sh = SingleDeviceSharding(device)
    put = partial(jax.tree.map, lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh))
    params = put(param_shapes(n_layer, d, vocab, block))
    opt = (params, params, jax.ShapeDtypeStruct((), jnp.float32, sharding=sh))
    tokens = jax.ShapeDtypeStruct((batch, block), jnp.int32, sharding=sh)
    step = jax.jit(partial(train_step, heads=n_head), donate_argnums=(0, 1))
    ma = step.lower(params, opt, tokens, tokens).compile().memory_analysis()
    return int(ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes - ma.alias_size_in_bytes)
