"""Built-in, device-agnostic PyTorch models with random weights, for benchmarks, `diagnose` and `tune`.

Each entry of `MODELS` is a `ModelSpec`: build it from its config dataclass, make an example batch on
any device, and compute its loss. No weights are downloaded; construction is deterministic under
`torch.manual_seed`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from tputool.errors import UserError
from tputool.models import cnn, llama, mlp, moe, vit
from tputool.models.loader import load_model_spec as _load
from tputool.models.spec import Batch, ModelSpec

MODELS: dict[str, ModelSpec] = {
    "mlp": mlp.SPEC,
    "cnn": cnn.SPEC,
    "llama": llama.SPEC,
    "moe": moe.SPEC,
    "vit": vit.SPEC,
}
"""Built-in model name -> ModelSpec."""


def build_model(name: str, **overrides: Any) -> nn.Module:
    """Build built-in model `name` from its default config with `overrides` (CPU, random weights)."""
    if name not in MODELS:
        raise UserError(f"unknown model '{name}' (built-in: {', '.join(sorted(MODELS))})")
    spec = MODELS[name]
    return spec.build(spec.config(**overrides))


def load_model_spec(spec: str) -> ModelSpec:
    """A built-in model by name, or a user's `path/to/file.py:build_fn` (see tputool.models.loader)."""
    return _load(spec, MODELS)


__all__ = ["MODELS", "Batch", "ModelSpec", "build_model", "load_model_spec"]
