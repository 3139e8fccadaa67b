"""A Llama-style decoder: RMSNorm, rotary embeddings, grouped-query causal attention, SwiGLU MLP.

Real-valued throughout (rotary embeddings use cos/sin tables, not complex numbers), so it runs on
devices without complex dtypes. `moe.py` reuses the attention and norm blocks defined here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tputool.models.spec import Batch, ModelSpec, classification_loss, init_normal, random_tokens


@dataclass(frozen=True)
class LlamaConfig:
    """Decoder sizes; `n_heads` must be a multiple of `n_kv_heads` and `dim` of `n_heads`."""

    vocab_size: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 128
    max_seq_len: int = 32
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True

    @classmethod
    def tiny(cls) -> LlamaConfig:
        """A few-hundred-thousand-parameter config for tests on CPU."""
        return cls()

    @classmethod
    def small(cls) -> LlamaConfig:
        """A ~30M-parameter config for benchmarks."""
        return cls(vocab_size=8192, dim=512, n_layers=6, n_heads=8, n_kv_heads=4, ffn_dim=1408, max_seq_len=256,
                   tie_embeddings=False)

    def check(self) -> None:
        """Raise ValueError when the sizes cannot build a decoder (heads must divide the widths)."""
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"dim ({self.dim}) must divide by n_heads ({self.n_heads}) and n_heads by "
                             f"n_kv_heads ({self.n_kv_heads})")

    @property
    def head_dim(self) -> int:
        """Per-head width."""
        return self.dim // self.n_heads


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """Normalise over the last dim."""
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return out.type_as(x) * self.weight


def rotary_tables(head_dim: int, max_seq_len: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin tables of shape (max_seq_len, head_dim) for the rotate-half form of RoPE."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (batch, heads, seq, head_dim) by position: x*cos + rotate_half(x)*sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Grouped-query causal self-attention through F.scaled_dot_product_attention."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        if config.dim % config.n_heads or config.n_heads % config.n_kv_heads:
            raise ValueError("dim must divide by n_heads and n_heads by n_kv_heads")
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.wq = nn.Linear(config.dim, config.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.n_heads * self.head_dim, config.dim, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """(batch, seq, dim) -> (batch, seq, dim)."""
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        rep = self.n_heads // self.n_kv_heads
        if rep > 1:
            k = k[:, :, None].expand(b, self.n_kv_heads, rep, t, self.head_dim).reshape(b, self.n_heads, t, -1)
            v = v[:, :, None].expand(b, self.n_kv_heads, rep, t, self.head_dim).reshape(b, self.n_heads, t, -1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x)."""

    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, ffn_dim, bias=False)
        self.w3 = nn.Linear(dim, ffn_dim, bias=False)
        self.w2 = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """(..., dim) -> (..., dim)."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm residual block: attention then a feed-forward module (SwiGLU unless given another)."""

    def __init__(self, config: LlamaConfig, ffn: nn.Module | None = None) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.dim, config.norm_eps)
        self.attn = Attention(config)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.ffn = ffn if ffn is not None else SwiGLU(config.dim, config.ffn_dim)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """(batch, seq, dim) -> (batch, seq, dim)."""
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    """Token embedding, `n_layers` blocks, final RMSNorm and an LM head (tied to the embedding or not)."""

    def __init__(self, config: LlamaConfig, blocks: list[nn.Module] | None = None) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(blocks if blocks is not None else [Block(config) for _ in range(config.n_layers)])
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.head = nn.Linear(config.dim, config.vocab_size, bias=False)
        cos, sin = rotary_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        init_normal(self)
        if config.tie_embeddings:
            self.head.weight = self.tok_emb.weight

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001 - nn.Module's private hook
        """Re-tie the head after `.to(device)`: PyTorch replaces parameters (dropping the tie) when the
        device's tensor type cannot share a shallow copy with CPU's, as for PrivateUse1 backends."""
        out = super()._apply(fn, recurse)
        if self.config.tie_embeddings and self.head.weight is not self.tok_emb.weight:
            self.head.weight = self.tok_emb.weight
        return out

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits (batch, seq, vocab) for token ids (batch, seq), seq <= max_seq_len."""
        t = tokens.shape[1]
        if t > self.config.max_seq_len:
            raise ValueError(f"sequence length {t} exceeds max_seq_len {self.config.max_seq_len}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.tok_emb(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(self.norm(x))


def example_batch(
    config: LlamaConfig, batch_size: int, device: torch.device | str = "cpu", generator: torch.Generator | None = None
) -> Batch:
    """Random token ids (batch, max_seq_len) and their next-token targets."""
    return random_tokens(config.vocab_size, batch_size, config.max_seq_len, device, generator)


SPEC = ModelSpec(
    name="llama",
    build=Llama,
    default_config=LlamaConfig.tiny,
    example_batch=example_batch,
    loss_fn=classification_loss,
    description="Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU",
)
