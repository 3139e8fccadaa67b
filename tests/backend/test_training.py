"""Training parity: built-in models train 20 AdamW steps on the device with the same losses as on CPU.

Same seed, same initial weights, same batch; losses per step must agree within rtol 1e-4 / atol 1e-5
(float32), final parameters within rtol/atol 1e-3 (AdamW's update divides by sqrt(v) and amplifies
rounding differences in small gradients).
"""

from __future__ import annotations

import copy

import pytest
import torch

from tputool.models import MODELS

STEPS = 20
LOSS_TOL = {"rtol": 1e-4, "atol": 1e-5}
PARAM_TOL = {"rtol": 1e-3, "atol": 1e-3}


def _train(model: torch.nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor, **adamw) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **adamw)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return [float(loss.cpu()) for loss in losses]


def _parity(name: str, device: str, **adamw) -> None:
    spec = MODELS[name]
    cfg = spec.config()
    torch.manual_seed(0)
    cpu_model = spec.build(cfg)
    dev_model = copy.deepcopy(cpu_model).to(device)
    x, y = spec.example_batch(cfg, 8, "cpu", torch.Generator().manual_seed(0))
    cpu_losses = _train(cpu_model, spec.loss_fn, x, y, **adamw)
    dev_losses = _train(dev_model, spec.loss_fn, x.to(device), y.to(device), **adamw)
    torch.testing.assert_close(torch.tensor(dev_losses), torch.tensor(cpu_losses), **LOSS_TOL)
    assert cpu_losses[-1] < cpu_losses[0]
    dev_state = {k: v.cpu() for k, v in dev_model.state_dict().items()}
    torch.testing.assert_close(dev_state, cpu_model.state_dict(), **PARAM_TOL)


@pytest.mark.parametrize("name", ["mlp", "cnn", "llama"])
def test_training_matches_cpu(name: str, tpu_device: str) -> None:
    _parity(name, tpu_device)


def test_training_matches_cpu_single_tensor_adamw(tpu_device: str) -> None:
    _parity("mlp", tpu_device, foreach=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["moe", "vit"])
def test_training_matches_cpu_slow(name: str, tpu_device: str) -> None:
    _parity(name, tpu_device)


def test_tied_head_stays_tied_on_device(tpu_device: str) -> None:
    torch.manual_seed(0)
    model = MODELS["llama"].build(MODELS["llama"].config()).to(tpu_device)
    assert model.head.weight is model.tok_emb.weight
