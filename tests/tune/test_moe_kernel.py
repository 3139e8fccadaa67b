"""The MoE dispatch as a tuning dimension: candidates, the cost of sparse dispatch, the config round trip, and
the choice reaching the model (tputool's MoE layers, and the tuner's exported step)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tputool.backend import runtime
from tputool.models import moe
from tputool.tune.api import resolve_model
from tputool.tune.arch import decoder_dims
from tputool.tune.candidate import MOE_DISPATCHES, Candidate
from tputool.tune.config import TuneConfig, apply_config, clear_config
from tputool.tune.cost_model import dispatched, estimate, sparse_capacity
from tputool.tune.hardware import tpu_hardware
from tputool.tune.space import SearchSpace, enumerate_space
from tputool.tune.step import build_step

TINY = {"n_layers": 1, "max_seq_len": 16}


@pytest.fixture(autouse=True)
def _no_active_config():
    clear_config()
    yield
    clear_config()


def _dims():
    return resolve_model("moe", TINY).dims


def test_tputools_moe_offers_every_dispatch_and_a_fixed_one_none():
    dims = _dims()
    assert dims.moe_dispatches == MOE_DISPATCHES and dims.capacity == dims.experts / dims.top_k
    fixed = resolve_model("moe", {**TINY, "dispatch": "gmm"}).dims
    assert fixed.moe_dispatches == () and fixed.capacity == 1.0


def test_dispatch_is_a_candidate_dimension():
    space = SearchSpace(batches=(2,), precisions=("fp32",), attentions=(("plain", 0),), remats=("none",))
    measured = {c.moe for c in enumerate_space(_dims(), 1, space).candidates}
    assert measured == set(MOE_DISPATCHES)
    predicted = {c.moe for c in enumerate_space(_dims(), 1, space, kernels=True).candidates}
    assert predicted == {"dense", "gmm"}
    narrowed = SearchSpace(batches=(2,), precisions=("fp32",), attentions=(("plain", 0),), remats=("none",),
                           moes=("ragged",))
    assert {c.moe for c in enumerate_space(_dims(), 1, narrowed).candidates} == {"ragged"}
    mixtral = decoder_dims("m", layers=2, hidden=512, heads=8, kv_heads=8, ffn=1024, vocab=1000, seq=512,
                           experts=8, top_k=2, capacity=1.25)  # a published run's fixed dispatch
    assert {c.moe for c in enumerate_space(mixtral, 1, space).candidates} == {""}


def test_sparse_dispatch_costs_its_routed_flops_not_every_expert():
    dims = resolve_model("moe", {"dim": 512, "ffn_dim": 2048, "n_experts": 8, "top_k": 2, "max_seq_len": 1024,
                                 "n_layers": 2}).dims
    hw = tpu_hardware("v5e-1")
    dense, gmm = (estimate(dims, Candidate(batch=8, moe=m), hw) for m in ("dense", "gmm"))
    cap = sparse_capacity(dims, 8 * 1024)
    assert cap == pytest.approx(1 + 8 * 64 / (8 * 1024 * 2))  # 8 experts x half a 128-row tile over 16k routed rows
    assert dense.mfu < gmm.mfu and gmm.step_s < dense.step_s
    # the expert matmuls' executed FLOPs shrink from experts/top_k = 4x the routed work to `cap` x
    active = dims.expert_params * dims.top_k / dims.experts
    tokens = 8 * 1024
    assert dense.hfu_flops - gmm.hfu_flops == pytest.approx(6 * active * (4 - cap) * tokens, rel=1e-6)
    assert estimate(dims, Candidate(batch=8), hw).step_s == dense.step_s  # "": the model's own (dense)
    # groups are per device: on a tensor axis of 2 each device groups half of each sequence
    assert dispatched(dims, Candidate(batch=8, tensor=2, moe="gmm")).capacity == sparse_capacity(dims, 8 * 512)


def test_config_round_trip_sets_the_runtime_dispatch(tmp_path):
    import yaml

    cfg = TuneConfig(Candidate(batch=2, moe="gmm"), model="moe")
    doc = cfg.to_dict()
    assert doc["moe_dispatch"] == "gmm"
    assert "moe_dispatch" not in TuneConfig(Candidate(batch=2)).to_dict()
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert apply_config(path).candidate.moe == "gmm"
    assert runtime.STATE.moe_dispatch == "gmm"
    clear_config()
    assert runtime.STATE.moe_dispatch is None


def test_a_config_selecting_gmm_makes_the_model_use_it(tmp_path, moe_expert_calls):
    import yaml

    calls = moe_expert_calls
    torch.manual_seed(0)
    model = moe.build(moe.MoEConfig(**TINY))
    x, _ = moe.example_batch(moe.MoEConfig(**TINY), 2)
    dense = model(x)
    assert calls == []
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(TuneConfig(Candidate(batch=2, moe="gmm"), model="moe").to_dict()))
    apply_config(path)
    torch.testing.assert_close(model(x), dense, rtol=1e-4, atol=1e-4)
    assert calls == ["gmm"]


def test_the_tuners_step_runs_each_dispatch_with_the_same_loss():
    rm = resolve_model("moe", TINY)
    losses = {}
    for m in MOE_DISPATCHES:
        step = build_step(rm.spec, rm.config, Candidate(batch=2, precision="fp32", moe=m))
        ops = {str(n.target) for n in step.exported.graph_module.graph.nodes if n.op == "call_function"}
        assert ("tputool.jax_op.default" in ops) == (m != "dense"), ops
        _, loss = step.fn(*step.init_args(rm.spec, rm.config))
        losses[m] = float(loss)
    np.testing.assert_allclose(list(losses.values()), losses["dense"], rtol=1e-5)
