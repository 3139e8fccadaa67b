"""`ModelSpec`: how a benchmark, `diagnose` or `tune` builds a model, makes a batch and computes a loss.

A spec is plain data around four callables, so built-in models (see `tputool.models.MODELS`) and a
user's own `path/to/file.py:build_fn` look the same to every caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tputool.errors import UserError

Batch = tuple[Tensor, Tensor]
"""(inputs, targets): the model is called as `model(inputs)`, the loss as `loss_fn(output, targets)`."""


@dataclass(frozen=True)
class ModelSpec:
    """A buildable model: `build(config)`, `example_batch(config, batch_size, device, generator)`, `loss_fn`."""

    name: str
    build: Callable[[Any], nn.Module]
    default_config: Callable[[], Any]
    example_batch: Callable[[Any, int, torch.device | str, torch.Generator | None], Batch]
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    description: str = ""

    def config(self, **overrides: Any) -> Any:
        """The default config with `overrides` applied; an unknown field is a UserError."""
        cfg = self.default_config()
        if not overrides:
            return cfg
        if not dataclasses.is_dataclass(cfg):
            raise UserError(f"model '{self.name}' takes no config overrides (got {', '.join(overrides)})")
        fields = {f.name for f in dataclasses.fields(cfg)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise UserError(
                f"model '{self.name}' has no config field {', '.join(unknown)} (fields: {', '.join(sorted(fields))})"
            )
        for key, value in overrides.items():
            _check_override(self.name, key, value, getattr(cfg, key))
        cfg = dataclasses.replace(cfg, **overrides)
        if hasattr(cfg, "check"):
            try:
                cfg.check()
            except ValueError as e:
                raise UserError(f"model '{self.name}': {e}") from None
        return cfg


def _check_override(model: str, key: str, value: Any, default: Any) -> None:
    """A config override has its default's type (an int is a float too) and, for sizes, is positive."""
    if default is None or isinstance(default, str):
        if value is not None and not isinstance(value, str):
            raise UserError(f"model '{model}': {key} must be text, got {value!r}")
        return
    if isinstance(default, bool):
        ok = isinstance(value, bool)
        want = "True or False"
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        want = "a positive integer"
    elif isinstance(default, float):
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        want = "a positive number"
    elif isinstance(default, tuple):
        ok = isinstance(value, tuple | list) and len(value) > 0 and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        want = "a tuple of positive integers like (16, 32)"
    else:
        return
    if not ok:
        raise UserError(f"model '{model}': {key} must be {want}, got {value!r}")


def classification_loss(output: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy over the last dim of `output`, flattening any leading dims (tokens or images)."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), targets.reshape(-1))


def random_tokens(
    vocab_size: int, batch_size: int, seq_len: int, device: torch.device | str, generator: torch.Generator | None
) -> Batch:
    """Next-token batch: (tokens[:, :-1], tokens[:, 1:]) of random ids, drawn on CPU then moved to `device`."""
    tokens = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=generator)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


def random_labelled(
    shape: tuple[int, ...], num_classes: int, batch_size: int, device: torch.device | str,
    generator: torch.Generator | None,
) -> Batch:
    """Gaussian inputs of `(batch_size, *shape)` and random class labels, drawn on CPU then moved to `device`."""
    x = torch.randn((batch_size, *shape), generator=generator)
    y = torch.randint(0, num_classes, (batch_size,), generator=generator)
    return x.to(device), y.to(device)


def init_normal(module: nn.Module, std: float = 0.02) -> None:
    """GPT-style init: normal(0, std) for Linear/Embedding weights, zero biases (uses torch's global RNG)."""
    for m in module.modules():
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)
