"""A small image classifier: [Conv -> BatchNorm -> ReLU -> MaxPool] blocks, then a Linear head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tputool.models.spec import Batch, ModelSpec, classification_loss, random_labelled


@dataclass(frozen=True)
class CNNConfig:
    """Input images (in_channels, image_size, image_size); one conv block per entry of `channels`."""

    in_channels: int = 3
    image_size: int = 32
    channels: tuple[int, ...] = (16, 32)
    num_classes: int = 10


class CNN(nn.Module):
    """Conv/BN/ReLU/MaxPool(2) blocks; each halves the spatial size, then flatten and Linear."""

    def __init__(self, config: CNNConfig) -> None:
        super().__init__()
        if config.image_size % (2 ** len(config.channels)):
            raise ValueError(f"image_size {config.image_size} is not divisible by 2**{len(config.channels)}")
        blocks: list[nn.Module] = []
        c_in = config.in_channels
        for c in config.channels:
            blocks += [nn.Conv2d(c_in, c, kernel_size=3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                       nn.MaxPool2d(2)]
            c_in = c
        self.features = nn.Sequential(*blocks)
        side = config.image_size // 2 ** len(config.channels)
        self.head = nn.Linear(c_in * side * side, config.num_classes)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of shape (batch, num_classes) for images (batch, C, H, W)."""
        return self.head(torch.flatten(self.features(x), 1))


def example_batch(
    config: CNNConfig, batch_size: int, device: torch.device | str = "cpu", generator: torch.Generator | None = None
) -> Batch:
    """Random images (batch, C, H, W) and labels (batch,)."""
    shape = (config.in_channels, config.image_size, config.image_size)
    return random_labelled(shape, config.num_classes, batch_size, device, generator)


SPEC = ModelSpec(
    name="cnn",
    build=CNN,
    default_config=CNNConfig,
    example_batch=example_batch,
    loss_fn=classification_loss,
    description="small CNN: conv/batchnorm/relu/maxpool blocks + linear head",
)
