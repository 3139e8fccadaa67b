"""A multi-layer perceptron classifier (Linear -> ReLU stacks) on Gaussian features."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tputool.models.spec import Batch, ModelSpec, classification_loss, random_labelled


@dataclass(frozen=True)
class MLPConfig:
    """Sizes of the MLP: `in_dim` features -> `hidden` layers -> `num_classes` logits."""

    in_dim: int = 32
    hidden: tuple[int, ...] = (64, 64)
    num_classes: int = 10


class MLP(nn.Module):
    """Linear/ReLU stack ending in a Linear to `num_classes` logits."""

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = config.in_dim
        for h in config.hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, config.num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of shape (batch, num_classes)."""
        return self.net(x)


def example_batch(
    config: MLPConfig, batch_size: int, device: torch.device | str = "cpu", generator: torch.Generator | None = None
) -> Batch:
    """Random features (batch, in_dim) and labels (batch,)."""
    return random_labelled((config.in_dim,), config.num_classes, batch_size, device, generator)


SPEC = ModelSpec(
    name="mlp",
    build=MLP,
    default_config=MLPConfig,
    example_batch=example_batch,
    loss_fn=classification_loss,
    description="MLP classifier: Linear/ReLU stack",
)
