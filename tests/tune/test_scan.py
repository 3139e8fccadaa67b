"""Scan over layers: one layer body under jax.lax.scan over stacked parameters gives the unrolled step's loss
and gradients (CPU, tiny models; runs everywhere)."""

from __future__ import annotations

import numpy as np
import pytest

from tputool.models import MODELS
from tputool.tune.candidate import Candidate
from tputool.tune.export import export_loss


@pytest.fixture(scope="module")
def llama3():
    spec = MODELS["llama"]
    cfg = spec.config(n_layers=3)
    return spec, cfg, export_loss(spec, cfg, 2, "fp32")


def test_layout_stacks_each_layer_parameter(llama3):
    from tputool.tune.lower import scan_layout

    _, _, exp = llama3
    plan = scan_layout(exp)
    assert plan is not None and len(plan.groups) == 1 and len(plan.groups[0].nodes) == 3
    assert plan.stacked["layers.*.attn.wq.weight"] == tuple(f"layers.{i}.attn.wq.weight" for i in range(3))
    stacked = plan.stack(exp.params)
    assert stacked["layers.*.ffn.w1.weight"].shape == (3, *exp.params["layers.0.ffn.w1.weight"].shape)
    assert "layers.0.attn.wq.weight" not in stacked and "tok_emb.weight" in stacked
    shapes = plan.stacked_shapes({k: v.shape for k, v in exp.params.items()})
    assert shapes == {k: v.shape for k, v in stacked.items()}


def test_no_scan_without_repeated_layers():
    from tputool.tune.lower import scan_layout

    spec = MODELS["mlp"]
    assert scan_layout(export_loss(spec, spec.config(), 2, "fp32")) is None


@pytest.mark.parametrize(("attention", "block", "remat"), [("plain", 0, "none"), ("chunked", 8, "full"),
                                                           ("plain", 0, "save-dots")])
def test_scanned_loss_and_grads_equal_unrolled(llama3, attention, block, remat):
    import jax
    import jax.numpy as jnp
    import torch

    from tputool.tune.lower import loss_function, scan_layout

    spec, cfg, exp = llama3
    x, y = spec.example_batch(cfg, 2, "cpu", torch.Generator().manual_seed(0))
    args = ({k: jnp.asarray(v) for k, v in exp.buffers.items()}, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
    params = {k: jnp.asarray(v) for k, v in exp.params.items()}
    plan = scan_layout(exp)
    unrolled = jax.jit(jax.value_and_grad(loss_function(exp, attention, block, remat)))
    scanned = jax.jit(jax.value_and_grad(loss_function(exp, attention, block, remat, scan=True)))
    loss_u, grads_u = unrolled(params, *args)
    loss_s, grads_s = scanned(plan.stack(params), *args)
    assert float(loss_s) == pytest.approx(float(loss_u), rel=1e-6)
    want = plan.stack(grads_u)
    assert set(grads_s) == set(want)
    for k, g in grads_s.items():
        np.testing.assert_allclose(np.asarray(g), np.asarray(want[k]), rtol=1e-5, atol=1e-7)
    hlo = scanned.lower(plan.stack(params), *args).as_text()
    assert "while" in hlo  # one layer body in a loop, not three


def test_scanned_training_step_matches_unrolled(llama3):
    import jax

    from tputool.tune.step import build_step

    spec, cfg, _ = llama3
    c = Candidate(data=1, batch=2, remat="save-dots", precision="fp32")
    built_u, built_s = (build_step(spec, cfg, c, scan_layers=scan) for scan in (False, True))
    assert built_u.scan is None and built_s.scan is not None
    (new_u, loss_u), (new_s, loss_s) = (jax.jit(b.fn)(*b.init_args(spec, cfg)) for b in (built_u, built_s))
    assert float(loss_s) == pytest.approx(float(loss_u), rel=1e-6)
    want = built_s.scan.stack({k: np.asarray(v) for k, v in new_u["params"].items()})
    for k, v in new_s["params"].items():
        np.testing.assert_allclose(np.asarray(v), want[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["moe", "vit"])
def test_other_layered_models_scan_to_the_same_loss(model):
    import jax.numpy as jnp
    import torch

    from tputool.tune.lower import loss_function, scan_layout

    spec = MODELS[model]
    cfg = spec.config()
    exp = export_loss(spec, cfg, 2, "fp32")
    plan = scan_layout(exp)
    assert plan is not None and [len(g.nodes) for g in plan.groups] == [cfg.n_layers]
    x, y = spec.example_batch(cfg, 2, "cpu", torch.Generator().manual_seed(0))
    args = ({k: jnp.asarray(v) for k, v in exp.buffers.items()}, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
    params = {k: jnp.asarray(v) for k, v in exp.params.items()}
    unrolled = loss_function(exp)(params, *args)
    scanned = loss_function(exp, scan=True)(plan.stack(params), *args)
    assert float(scanned) == pytest.approx(float(unrolled), rel=1e-6)
