"""A small vision transformer: patch embedding, class token, pre-norm encoder blocks, linear head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tputool.models.spec import Batch, ModelSpec, classification_loss, init_normal, random_labelled


@dataclass(frozen=True)
class ViTConfig:
    """Images (in_channels, image_size, image_size) cut into `patch_size` squares; encoder of `n_layers`."""

    image_size: int = 32
    patch_size: int = 8
    in_channels: int = 3
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    mlp_dim: int = 128
    num_classes: int = 10

    def check(self) -> None:
        """Raise ValueError when the sizes cannot build a ViT (patches tile the image, heads divide dim)."""
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size ({self.image_size}) must divide by patch_size ({self.patch_size})")
        if self.dim % self.n_heads:
            raise ValueError(f"dim ({self.dim}) must divide by n_heads ({self.n_heads})")


class EncoderBlock(nn.Module):
    """Pre-norm block: multi-head self-attention (SDPA, no mask) then a GELU MLP."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        if config.dim % config.n_heads:
            raise ValueError("dim must divide by n_heads")
        self.n_heads = config.n_heads
        self.norm1 = nn.LayerNorm(config.dim)
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.proj = nn.Linear(config.dim, config.dim)
        self.norm2 = nn.LayerNorm(config.dim)
        self.mlp = nn.Sequential(nn.Linear(config.dim, config.mlp_dim), nn.GELU(), nn.Linear(config.mlp_dim, config.dim))

    def forward(self, x: Tensor) -> Tensor:
        """(batch, tokens, dim) -> (batch, tokens, dim)."""
        b, n, d = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        x = x + self.proj(attn.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Conv patch embedding + class token + learned positions, encoder blocks, head on the class token."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        if config.image_size % config.patch_size:
            raise ValueError(f"image_size {config.image_size} is not divisible by patch_size {config.patch_size}")
        n_patches = (config.image_size // config.patch_size) ** 2
        self.patch = nn.Conv2d(config.in_channels, config.dim, kernel_size=config.patch_size, stride=config.patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, config.dim))
        self.pos = nn.Parameter(torch.randn(1, n_patches + 1, config.dim) * 0.02)
        self.blocks = nn.ModuleList([EncoderBlock(config) for _ in range(config.n_layers)])
        self.norm = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.num_classes)
        init_normal(self)

    def forward(self, images: Tensor) -> Tensor:
        """Logits (batch, num_classes) for images (batch, C, H, W)."""
        x = self.patch(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def example_batch(
    config: ViTConfig, batch_size: int, device: torch.device | str = "cpu", generator: torch.Generator | None = None
) -> Batch:
    """Random images (batch, C, H, W) and labels (batch,)."""
    shape = (config.in_channels, config.image_size, config.image_size)
    return random_labelled(shape, config.num_classes, batch_size, device, generator)


SPEC = ModelSpec(
    name="vit",
    build=ViT,
    default_config=ViTConfig,
    example_batch=example_batch,
    loss_fn=classification_loss,
    description="small vision transformer: patch conv, class token, pre-norm encoder",
)
