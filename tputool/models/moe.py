"""A mixture-of-experts variant of the Llama decoder: each block's SwiGLU is a top-k routed expert layer.

Dispatch is dense: every expert runs on every token and a (tokens, experts) gate matrix, zero outside
each token's top-k, mixes the results. Shapes never depend on the routing, so the layer traces to one
static graph (the cost is n_experts/top_k times the FLOPs of sparse dispatch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tputool.models.llama import Block, Llama, LlamaConfig
from tputool.models.llama import example_batch as llama_batch
from tputool.models.spec import Batch, ModelSpec, classification_loss


@dataclass(frozen=True)
class MoEConfig(LlamaConfig):
    """Llama sizes plus the expert layer: `n_experts` SwiGLU experts of width `ffn_dim`, `top_k` per token."""

    n_experts: int = 4
    top_k: int = 2

    @classmethod
    def small(cls) -> MoEConfig:
        """A benchmark-sized config with 8 experts, 2 per token."""
        return cls(vocab_size=8192, dim=512, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=704, max_seq_len=256,
                   tie_embeddings=False, n_experts=8, top_k=2)


class MoEFeedForward(nn.Module):
    """Top-k softmax router over `n_experts` SwiGLU experts with stacked weights, densely dispatched."""

    def __init__(self, dim: int, ffn_dim: int, n_experts: int, top_k: int) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        self.top_k = top_k
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(n_experts, dim, ffn_dim) * 0.02)
        self.w3 = nn.Parameter(torch.randn(n_experts, dim, ffn_dim) * 0.02)
        self.w2 = nn.Parameter(torch.randn(n_experts, ffn_dim, dim) * 0.02)

    def gates(self, x: Tensor) -> Tensor:
        """(batch, seq, n_experts) mixing weights: renormalised top-k router probabilities, zero elsewhere."""
        probs = F.softmax(self.router(x), dim=-1)
        top_w, top_i = probs.topk(self.top_k, dim=-1)
        top_w = top_w / top_w.sum(dim=-1, keepdim=True)
        return torch.zeros_like(probs).scatter(-1, top_i, top_w)

    def forward(self, x: Tensor) -> Tensor:
        """(batch, seq, dim) -> (batch, seq, dim)."""
        g = self.gates(x)
        h = F.silu(torch.einsum("btd,edf->btef", x, self.w1)) * torch.einsum("btd,edf->btef", x, self.w3)
        y = torch.einsum("btef,efd->bted", h, self.w2)
        return torch.einsum("bted,bte->btd", y, g)


def build(config: MoEConfig) -> Llama:
    """A Llama decoder whose blocks use MoEFeedForward."""
    blocks = [Block(config, MoEFeedForward(config.dim, config.ffn_dim, config.n_experts, config.top_k))
              for _ in range(config.n_layers)]
    return Llama(config, blocks)


def example_batch(
    config: MoEConfig, batch_size: int, device: torch.device | str = "cpu", generator: torch.Generator | None = None
) -> Batch:
    """Random token ids (batch, max_seq_len) and their next-token targets."""
    return llama_batch(config, batch_size, device, generator)


SPEC = ModelSpec(
    name="moe",
    build=build,
    default_config=MoEConfig.tiny,
    example_batch=example_batch,
    loss_fn=classification_loss,
    description="mixture-of-experts decoder: top-k router, dense static-shape dispatch",
)
