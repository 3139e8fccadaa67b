"""A mixture-of-experts variant of the Llama decoder: each block's SwiGLU is a top-k routed expert layer.

Two ways to dispatch tokens to experts (`DISPATCHES`), the same outputs and gradients:
- "dense" (the default): every expert runs on every token and a (tokens, experts) gate matrix, zero outside
  each token's top-k, mixes the results (n_experts/top_k times the FLOPs of sparse dispatch);
- "ragged" / "gmm", sparse: `torch.tpu.ops.moe_experts` with that grouped matmul implementation
  (jax.lax.ragged_dot, or the Pallas megablox kernels), one op: the (token, k) assignments are sorted by
  expert, their rows gathered, the three expert matmuls run as grouped matmuls, then the rows are weighted by
  their gates and summed back per token. Only the group sizes depend on the routing, so shapes stay static.
  On the active tuned config's mesh it runs per device (each device sorts its own tokens).
A layer built without a dispatch follows `runtime.STATE.moe_dispatch` (a tuned config's choice, read at
each forward), dense when unset.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tputool.backend import runtime
from tputool.backend.tpu_api.ops import moe_experts
from tputool.models.llama import Block, Llama, LlamaConfig
from tputool.models.llama import example_batch as llama_batch
from tputool.models.spec import Batch, ModelSpec, classification_loss

DISPATCHES = ("dense", "ragged", "gmm")
"""Token dispatch of the expert layer: dense, or sparse through grouped matmuls of that implementation."""


@dataclass(frozen=True)
class MoEConfig(LlamaConfig):
    """Llama sizes plus the expert layer: `n_experts` SwiGLU experts of width `ffn_dim`, `top_k` per token,
    dispatched by `dispatch` (one of DISPATCHES; None: `runtime.STATE.moe_dispatch`, else dense)."""

    n_experts: int = 4
    top_k: int = 2
    dispatch: str | None = None

    def check(self) -> None:
        """LlamaConfig's checks plus 1 <= top_k <= n_experts and a known dispatch."""
        super().check()
        if not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={self.n_experts}], got {self.top_k}")
        if self.dispatch is not None and self.dispatch not in DISPATCHES:
            raise ValueError(f"dispatch must be one of {', '.join(DISPATCHES)}, got {self.dispatch!r}")

    @classmethod
    def small(cls) -> MoEConfig:
        """A benchmark-sized config with 8 experts, 2 per token."""
        return cls(vocab_size=8192, dim=512, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=704, max_seq_len=256,
                   tie_embeddings=False, n_experts=8, top_k=2)


class MoEFeedForward(nn.Module):
    """Top-k softmax router over `n_experts` SwiGLU experts with stacked weights, dispatched by `dispatch`."""

    def __init__(self, dim: int, ffn_dim: int, n_experts: int, top_k: int, dispatch: str | None = None) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be in [1, n_experts={n_experts}], got {top_k}")
        if dispatch is not None and dispatch not in DISPATCHES:
            raise ValueError(f"dispatch must be one of {DISPATCHES}, got {dispatch!r}")
        self.top_k = top_k
        self.dispatch = dispatch
        self.router = nn.Linear(dim, n_experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(n_experts, dim, ffn_dim) * 0.02)
        self.w3 = nn.Parameter(torch.randn(n_experts, dim, ffn_dim) * 0.02)
        self.w2 = nn.Parameter(torch.randn(n_experts, ffn_dim, dim) * 0.02)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(weights, experts), each (..., top_k): each token's top-k experts and renormalised probabilities."""
        probs = F.softmax(self.router(x), dim=-1)
        top_w, top_i = probs.topk(self.top_k, dim=-1)
        return top_w / top_w.sum(dim=-1, keepdim=True), top_i

    def gates(self, x: Tensor) -> Tensor:
        """(batch, seq, n_experts) mixing weights: renormalised top-k router probabilities, zero elsewhere."""
        top_w, top_i = self.route(x)
        return top_w.new_zeros((*x.shape[:-1], self.w1.shape[0])).scatter(-1, top_i, top_w)

    def forward(self, x: Tensor) -> Tensor:
        """(batch, seq, dim) -> (batch, seq, dim)."""
        dispatch = self.dispatch or runtime.STATE.moe_dispatch or "dense"
        if dispatch != "dense":
            return self.sparse(x, dispatch)
        g = self.gates(x)
        h = F.silu(torch.einsum("btd,edf->btef", x, self.w1)) * torch.einsum("btd,edf->btef", x, self.w3)
        y = torch.einsum("btef,efd->bted", h, self.w2)
        return torch.einsum("bted,bte->btd", y, g)

    def sparse(self, x: Tensor, impl: str) -> Tensor:
        """Sparse dispatch: each token's top_k experts through `torch.tpu.ops.moe_experts` (grouped matmuls
        `impl`)."""
        top_w, top_i = self.route(x)
        return moe_experts(x, top_w, top_i, self.w1, self.w3, self.w2, impl=impl)


def build(config: MoEConfig) -> Llama:
    """A Llama decoder whose blocks use MoEFeedForward."""
    blocks = [Block(config, MoEFeedForward(config.dim, config.ffn_dim, config.n_experts, config.top_k,
                                           config.dispatch))
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
    description="mixture-of-experts decoder: top-k router, dense or grouped-matmul (ragged/gmm) dispatch",
)
