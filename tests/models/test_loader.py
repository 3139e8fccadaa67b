"""`load_model_spec`: built-in names, user `file.py:build_fn` specs, and one-line errors for bad specs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from tputool.errors import UserError
from tputool.models import MODELS, load_model_spec


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "my_model.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_builtin_name() -> None:
    assert load_model_spec("llama") is MODELS["llama"]


def test_user_module_with_example_batch(tmp_path: Path) -> None:
    path = _write(tmp_path, """
        import torch
        from torch import nn

        def build():
            return nn.Linear(3, 1)

        def example_batch(batch_size, device, generator):
            x = torch.randn(batch_size, 3, generator=generator)
            return x.to(device), x.sum(1, keepdim=True).to(device)
    """)
    spec = load_model_spec(f"{path}:build")
    model = spec.build(spec.config())
    x, y = spec.example_batch(spec.config(), 6, "cpu", torch.Generator().manual_seed(0))
    loss = spec.loss_fn(model(x), y)
    assert tuple(x.shape) == (6, 3) and loss.ndim == 0
    torch.testing.assert_close(loss, torch.nn.functional.mse_loss(model(x), y))


def test_user_function_returning_spec(tmp_path: Path) -> None:
    path = _write(tmp_path, """
        from tputool.models import MODELS
        import dataclasses

        def make():
            return dataclasses.replace(MODELS["mlp"], name="mine")
    """)
    assert load_model_spec(f"{path}:make").name == "mine"


@pytest.mark.parametrize(
    ("body", "fn", "message"),
    [
        ("def build():\n    return 3\n", "build", "must return a ModelSpec or an nn.Module, got int"),
        ("from torch import nn\ndef build():\n    return nn.Linear(1, 1)\n", "build", "must define example_batch"),
        ("x = 1\n", "build", "no function 'build'"),
        ("import nonexistent_pkg_xyz\n", "build", "importing .* failed: ModuleNotFoundError"),
        ("def build():\n    raise RuntimeError('boom')\n", "build", r"build\(\) raised RuntimeError: boom"),
    ],
)
def test_bad_user_files(tmp_path: Path, body: str, fn: str, message: str) -> None:
    path = _write(tmp_path, body)
    with pytest.raises(UserError, match=message) as info:
        load_model_spec(f"{path}:{fn}")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpt9", "unknown model 'gpt9'"),
        ("missing/file.py:build", "model file not found"),
        ("file.py:", "expected path/to/file.py:build_fn"),
        ("file.py:not-an-identifier", "expected path/to/file.py:build_fn"),
    ],
)
def test_bad_spec_strings(spec: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_model_spec(spec)


def test_non_python_file(tmp_path: Path) -> None:
    path = tmp_path / "weights.txt"
    path.write_text("x")
    with pytest.raises(UserError, match="must be a .py file"):
        load_model_spec(f"{path}:build")
