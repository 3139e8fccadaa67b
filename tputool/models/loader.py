"""Resolve a model spec string: a built-in name (`llama`) or a user's `path/to/file.py:build_fn`.

A user's `build_fn()` takes no arguments and returns either a `ModelSpec`, or an `nn.Module`; in the
second case the same file must define `example_batch(batch_size, device, generator) -> (inputs,
targets)` and may define `loss_fn(output, targets)` (default: cross-entropy for integer targets,
mean squared error otherwise).
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from tputool.errors import UserError
from tputool.models.spec import ModelSpec, classification_loss


def default_loss(output: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy when `targets` are integer class ids, mean squared error otherwise."""
    if not targets.dtype.is_floating_point:
        return classification_loss(output, targets)
    return F.mse_loss(output, targets)


def _import_file(path: Path) -> ModuleType:
    name = "tputool_user_model_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"cannot import {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any failure in user code becomes one line
        del sys.modules[name]
        first = str(e).splitlines()[0] if str(e) else ""
        raise UserError(f"importing {path} failed: {type(e).__name__}: {first}") from e
    return module


def _spec_from_module(module: ModuleType, fn_name: str, label: str) -> ModelSpec:
    fn = getattr(module, fn_name, None)
    if fn is None or not callable(fn):
        raise UserError(f"{label}: no function '{fn_name}' in the file")
    try:
        built: Any = fn()
    except Exception as e:  # noqa: BLE001
        first = str(e).splitlines()[0] if str(e) else ""
        raise UserError(f"{label}: {fn_name}() raised {type(e).__name__}: {first}") from e
    if isinstance(built, ModelSpec):
        return built
    if not isinstance(built, nn.Module):
        raise UserError(f"{label}: {fn_name}() must return a ModelSpec or an nn.Module, got {type(built).__name__}")
    batch_fn = getattr(module, "example_batch", None)
    if batch_fn is None or not callable(batch_fn):
        raise UserError(f"{label}: {fn_name}() returns an nn.Module, so the file must define "
                        "example_batch(batch_size, device, generator)")
    loss = getattr(module, "loss_fn", None) or default_loss
    return ModelSpec(
        name=label,
        build=lambda _config: fn(),
        default_config=lambda: None,
        example_batch=lambda _config, batch_size, device="cpu", generator=None: batch_fn(batch_size, device, generator),
        loss_fn=loss,
        description=f"user model {label}",
    )


def load_model_spec(spec: str, builtins: Mapping[str, ModelSpec]) -> ModelSpec:
    """A built-in model by name, or `path/to/file.py:build_fn`; anything else is a one-line UserError."""
    spec = spec.strip()
    if spec in builtins:
        return builtins[spec]
    known = ", ".join(sorted(builtins))
    if ":" not in spec:
        raise UserError(f"unknown model '{spec}' (built-in: {known}; or give path/to/file.py:build_fn)")
    file_part, _, fn_name = spec.rpartition(":")
    if not file_part or not fn_name.isidentifier():
        raise UserError(f"bad model spec '{spec}': expected path/to/file.py:build_fn")
    path = Path(file_part).expanduser().resolve()
    if not path.is_file():
        raise UserError(f"model file not found: {file_part}")
    if path.suffix != ".py":
        raise UserError(f"model file must be a .py file: {file_part}")
    return _spec_from_module(_import_file(path), fn_name, spec)
