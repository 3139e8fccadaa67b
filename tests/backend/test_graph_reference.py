"""The JAX reference Llama of the benchmark (`benchmarks/jax_llama.py`) computes what tputool's torch Llama does.

Same weights and batch: equal logits, equal loss, and equal losses over three AdamW steps (CPU, float32),
so the benchmark's ratio compares the same work.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import torch

from tputool.models import MODELS

_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, _BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


jax_llama = _benchmark("jax_llama")


def _llama():
    """The built-in Llama's spec, config, seeded model, a batch, and the model's weights as the reference's params."""
    spec = MODELS["llama"]
    cfg = spec.config()
    torch.manual_seed(0)
    model = spec.build(cfg)
    x, y = spec.example_batch(cfg, 2, "cpu", torch.Generator().manual_seed(0))
    return spec, cfg, model, x, y, jax_llama.params_from_torch(model)


def test_reference_matches_torch_llama_forward_and_training() -> None:
    spec, cfg, model, x, y, params = _llama()
    train_step, infer = jax_llama.make_steps(cfg)

    logits = np.asarray(infer(params, jnp.asarray(x.numpy())))
    np.testing.assert_allclose(logits, model(x).detach().numpy(), rtol=1e-4, atol=1e-5)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = jax_llama.adamw_init(params)
    for _ in range(3):
        opt.zero_grad()
        loss = spec.loss_fn(model(x), y)
        loss.backward()
        opt.step()
        params, state, jloss = train_step(params, state, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
        np.testing.assert_allclose(float(jloss), loss.item(), rtol=1e-5, atol=1e-6)


def test_clipped_reference_matches_the_first_step_benchmarks_torch_loop() -> None:
    # benchmarks/first_step.py's JAX floor for the Llama: clipping to global norm 1.0 and AdamW with two groups
    # (weight decay 0.1 on matrices, none on vectors, betas 0.9/0.95, lr 6e-4), as its torch loop (and its
    # `_optimizer`) does; the losses (clipping) and the weights (decay) differ if either is left out
    spec, cfg, model, x, y, params = _llama()
    step = jax_llama.make_clipped_train_step(cfg)
    opt = _benchmark("first_step")._optimizer(model)
    state = jax_llama.adamw_init(params)
    clipped = []
    for _ in range(4):
        opt.zero_grad()
        loss = spec.loss_fn(model(x), y)
        loss.backward()
        clipped.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)) > 1.0)
        opt.step()
        params, state, jloss = step(params, state, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
        np.testing.assert_allclose(float(jloss), loss.item(), rtol=1e-5, atol=1e-6)
    assert any(clipped)  # the clipping mattered
    for name, w in (("norm", model.norm.weight), ("tok_emb", model.tok_emb.weight)):  # no decay / decayed
        np.testing.assert_allclose(np.asarray(params[name]), w.detach().numpy(), rtol=1e-5, atol=5e-6)
