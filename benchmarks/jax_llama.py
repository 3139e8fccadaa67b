"""The reference: tputool's Llama (`tputool.models.llama`) written directly in JAX, same config and same math.

RMSNorm in float32, rotate-half RoPE from the same cos/sin tables, grouped-query causal attention, SwiGLU,
tied or untied LM head, cross-entropy over flattened tokens, and AdamW with torch's defaults (decoupled
weight decay 0.01, bias-corrected moments). `params_from_torch` takes a torch Llama's weights so both
sides start from identical parameters; `train_step` is one `jax.jit` (forward, backward, AdamW update).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Params = dict[str, Any]


def params_from_torch(model: Any) -> Params:
    """Nested dict of JAX arrays with the weights of torch Llama `model` (tied head stored once)."""
    sd = {k: jnp.asarray(v.detach().cpu().numpy()) for k, v in model.state_dict().items()}
    cfg = model.config
    layers = []
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        layers.append({
            "attn_norm": sd[p + "attn_norm.weight"], "ffn_norm": sd[p + "ffn_norm.weight"],
            **{n: sd[p + f"attn.{n}.weight"] for n in ("wq", "wk", "wv", "wo")},
            **{n: sd[p + f"ffn.{n}.weight"] for n in ("w1", "w2", "w3")},
        })
    params = {"tok_emb": sd["tok_emb.weight"], "norm": sd["norm.weight"], "layers": layers}
    if not cfg.tie_embeddings:
        params["head"] = sd["head.weight"]
    return params


def _rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    out = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return out.astype(x.dtype) * w


def rotary_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin of shape (max_seq_len, head_dim), as in the torch model."""
    inv_freq = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    angles = np.outer(np.arange(max_seq_len, dtype=np.float32), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    return jnp.asarray(np.cos(angles)), jnp.asarray(np.sin(angles))


def _rotary(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _attention(lp: Params, x: jax.Array, cos: jax.Array, sin: jax.Array, cfg: Any) -> jax.Array:
    b, t, _ = x.shape
    hd = cfg.head_dim
    q = (x @ lp["wq"].T).reshape(b, t, cfg.n_heads, hd).transpose(0, 2, 1, 3)
    k = (x @ lp["wk"].T).reshape(b, t, cfg.n_kv_heads, hd).transpose(0, 2, 1, 3)
    v = (x @ lp["wv"].T).reshape(b, t, cfg.n_kv_heads, hd).transpose(0, 2, 1, 3)
    q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
    rep = cfg.n_heads // cfg.n_kv_heads
    if rep > 1:
        k, v = jnp.repeat(k, rep, axis=1), jnp.repeat(v, rep, axis=1)
    scores = (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(jnp.float32(hd)).astype(q.dtype)
    mask = jnp.tril(jnp.ones((t, t), dtype=bool))
    scores = jnp.where(mask, scores, -jnp.inf)
    out = jax.nn.softmax(scores, axis=-1) @ v
    return out.transpose(0, 2, 1, 3).reshape(b, t, -1) @ lp["wo"].T


def forward(params: Params, tokens: jax.Array, cfg: Any, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Logits (batch, seq, vocab) for token ids (batch, seq)."""
    t = tokens.shape[1]
    cos, sin = cos[:t], sin[:t]
    x = params["tok_emb"][tokens]
    for lp in params["layers"]:
        x = x + _attention(lp, _rms_norm(x, lp["attn_norm"], cfg.norm_eps), cos, sin, cfg)
        h = _rms_norm(x, lp["ffn_norm"], cfg.norm_eps)
        x = x + (jax.nn.silu(h @ lp["w1"].T) * (h @ lp["w3"].T)) @ lp["w2"].T
    head = params["head"] if "head" in params else params["tok_emb"]
    return _rms_norm(x, params["norm"], cfg.norm_eps) @ head.T


def loss_fn(params: Params, tokens: jax.Array, targets: jax.Array, cfg: Any, cos: jax.Array,
            sin: jax.Array) -> jax.Array:
    """Mean cross-entropy of next-token prediction, as `tputool.models.spec.classification_loss`."""
    logits = forward(params, tokens, cfg, cos, sin)
    logits = logits.reshape(-1, logits.shape[-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets.reshape(-1, 1), axis=-1))


def adamw_init(params: Params) -> dict:
    """AdamW state: step count and zero first/second moments."""
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"step": jnp.zeros((), jnp.int32), "m": zeros, "v": jax.tree.map(jnp.zeros_like, params)}


def adamw_update(params: Params, grads: Params, state: dict, lr: float = 1e-3, b1: float = 0.9,
                 b2: float = 0.999, eps: float = 1e-8, wd: float = 0.01, vector_wd: float | None = None
                 ) -> tuple[Params, dict]:
    """One torch.optim.AdamW step (default hyper-parameters); `vector_wd`: the weight decay of parameters under
    two dimensions, where it differs from `wd` (a second parameter group)."""
    step = state["step"] + 1
    m = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state["v"], grads)
    c1 = 1 - b1 ** step.astype(jnp.float32)
    c2 = 1 - b2 ** step.astype(jnp.float32)

    def upd(p, m, v):
        p = p * (1 - lr * (wd if p.ndim >= 2 or vector_wd is None else vector_wd))
        return p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)

    return jax.tree.map(upd, params, m, v), {"step": step, "m": m, "v": v}


def clip_by_global_norm(grads: Params, max_norm: float) -> Params:
    """torch.nn.utils.clip_grad_norm_(..., max_norm): every gradient times min(1, max_norm / (norm + 1e-6))."""
    norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    scale = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    return jax.tree.map(lambda g: g * scale, grads)


def make_clipped_train_step(cfg: Any, lr: float = 6e-4, b1: float = 0.9, b2: float = 0.95, wd: float = 0.1,
                            max_norm: float = 1.0) -> Any:
    """The jitted step of a nanoGPT-style loop (benchmarks/first_step.py's): forward, backward, clip to global
    norm `max_norm`, AdamW with weight decay `wd` on matrices and none on vectors;
    train_step(params, opt_state, tokens, targets) -> (params, opt_state, loss)."""
    cos, sin = rotary_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)

    def train_step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets, cfg, cos, sin)
        grads = clip_by_global_norm(grads, max_norm)
        params, opt_state = adamw_update(params, grads, opt_state, lr=lr, b1=b1, b2=b2, wd=wd, vector_wd=0.0)
        return params, opt_state, loss

    return jax.jit(train_step, donate_argnums=(0, 1))


def make_steps(cfg: Any) -> tuple[Any, Any]:
    """(jitted train_step(params, opt_state, tokens, targets) -> (params, opt_state, loss),
    jitted forward(params, tokens) -> logits) for config `cfg`."""
    cos, sin = rotary_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)

    def train_step(params, opt_state, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets, cfg, cos, sin)
        params, opt_state = adamw_update(params, grads, opt_state)
        return params, opt_state, loss

    def infer(params, tokens):
        return forward(params, tokens, cfg, cos, sin)

    return jax.jit(train_step, donate_argnums=(0, 1)), jax.jit(infer)
