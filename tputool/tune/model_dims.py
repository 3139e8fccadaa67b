"""Read a `ModelDims` off a built torch model and its config (Llama/MoE/ViT fields, or just the params)."""

from __future__ import annotations

from typing import Any

from torch import nn

from tputool.tune.candidate import MOE_DISPATCHES, ModelDims

_CONFIG_FIELDS = {
    "layers": ("n_layers", "num_hidden_layers", "num_layers"),
    "hidden": ("dim", "hidden_size", "d_model"),
    "heads": ("n_heads", "num_attention_heads", "num_heads"),
    "kv_heads": ("n_kv_heads", "num_key_value_heads"),
    "ffn": ("ffn_dim", "mlp_dim", "intermediate_size"),
    "seq": ("max_seq_len", "max_position_embeddings", "seq_len"),
    "vocab": ("vocab_size",),
}
"""ModelDims field -> config attribute names that hold it, first match wins (data, not machinery)."""


def _field(config: Any, names: tuple[str, ...]) -> int:
    for n in names:
        v = getattr(config, n, None)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return 0


def count_matmul_params(module: nn.Module) -> int:
    """Weights used in a matmul once per token: all >=2-D parameters except untied embedding tables."""
    embedding_ids = {id(m.weight) for m in module.modules() if isinstance(m, nn.Embedding)}
    linear_ids = {id(m.weight) for m in module.modules() if isinstance(m, nn.Linear)}
    total = 0
    for p in module.parameters():  # parameters() yields a tied weight once
        if p.dim() < 2:
            continue
        if id(p) in embedding_ids and id(p) not in linear_ids:
            continue
        total += p.numel()
    return total


def model_dims(name: str, module: nn.Module, config: Any, seq: int | None = None) -> ModelDims:
    """ModelDims for `module` built from `config`; `seq` overrides the sequence length (tokens per sample)."""
    f = {k: _field(config, v) for k, v in _CONFIG_FIELDS.items()}
    heads = f["heads"]
    kv = f["kv_heads"] or heads
    hidden = f["hidden"]
    image, patch = _field(config, ("image_size",)), _field(config, ("patch_size",))
    if seq is None:
        seq = f["seq"] or ((image // patch) ** 2 + 1 if image and patch else 1)
    experts = _field(config, ("n_experts", "num_experts"))
    top_k = _field(config, ("top_k", "num_experts_per_tok")) if experts else 0
    expert_params = sum(p.numel() for p in module.parameters() if p.dim() == 3) if experts else 0
    # tputool's MoE dispatches as its config says, or (None) as the tuned config chooses; others: densely
    fixed = getattr(config, "dispatch", "dense")
    choices = MOE_DISPATCHES if experts and top_k and hasattr(config, "dispatch") and fixed is None else ()
    capacity = experts / top_k if experts and top_k and fixed in (None, "dense") else 1.0
    return ModelDims(
        name=name, params=sum(p.numel() for p in module.parameters()), matmul_params=count_matmul_params(module),
        layers=f["layers"], hidden=hidden, heads=heads, kv_heads=kv, head_dim=hidden // heads if heads else 0,
        ffn=f["ffn"], seq=seq, vocab=f["vocab"], experts=experts, top_k=top_k, expert_params=expert_params,
        capacity=capacity, moe_dispatches=choices, causal=not (image and patch),
    )
