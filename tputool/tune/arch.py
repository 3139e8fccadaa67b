"""`ModelDims` of a Llama/Mixtral-style decoder from its published sizes (no torch model needed).

Used for models tputool has no built-in config for at their real size (Llama 2 70B, Llama 3.1 405B,
Mixtral 8x22B, ...) and for the reference runs the cost model is calibrated against.
"""

from __future__ import annotations

from tputool.tune.candidate import ModelDims


def decoder_dims(name: str, *, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int,
                 seq: int, head_dim: int | None = None, experts: int = 0, top_k: int = 0,
                 capacity: float = 1.0, tied: bool = False) -> ModelDims:
    """A SwiGLU decoder with grouped-query attention; `experts`/`top_k` make every feed-forward an MoE layer."""
    hd = head_dim or hidden // heads
    attn = hidden * hd * (2 * heads + 2 * kv_heads)  # wq, wo + wk, wv
    one_ffn = 3 * hidden * ffn
    n_ffn = experts or 1
    router = hidden * experts if experts else 0
    per_layer = attn + n_ffn * one_ffn + router
    embed = vocab * hidden
    head = 0 if tied else vocab * hidden
    norms = layers * 2 * hidden + hidden
    matmul = layers * per_layer + (embed if tied else head)
    return ModelDims(
        name=name, params=layers * per_layer + embed + head + norms, matmul_params=matmul, layers=layers,
        hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=hd, ffn=ffn, seq=seq, vocab=vocab,
        experts=experts, top_k=top_k, expert_params=layers * n_ffn * one_ffn if experts else 0,
        capacity=capacity if experts else 1.0,
    )
