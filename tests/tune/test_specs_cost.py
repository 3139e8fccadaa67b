"""Spec table, slice parsing and the roofline cost model."""

from __future__ import annotations

import math

import pytest

from tputool.errors import UserError
from tputool.tune.candidate import Candidate, ModelDims
from tputool.tune.cost_model import estimate, mxu_efficiency
from tputool.tune.efficiency import Efficiency
from tputool.tune.hardware import tpu_hardware
from tputool.tune.slices import chip_by_name, mesh_axis_bandwidth, parse_target
from tputool.tune.specs import CHIPS


def test_table_has_every_generation_per_device():
    assert set(CHIPS) == {"v4", "v5e", "v5p", "v6e", "v7x"}
    assert CHIPS["v7x"].devices_per_chip == 2
    assert CHIPS["v7x"].peak_bf16_flops == pytest.approx(1153.5e12)
    assert CHIPS["v6e"].mxu == 256 and CHIPS["v5e"].mxu == 128
    assert chip_by_name("TPU v5 lite") is CHIPS["v5e"]


@pytest.mark.parametrize(("target", "devices", "topo", "name"), [
    ("v5e-256", 256, (16, 16), "v5e:16x16"),
    ("v6e-8", 8, (2, 4), "v6e:2x4"),
    ("v7x-128", 128, (4, 4, 4), "tpu7x:4x4x4"),
    ("v5p-8", 4, (2, 2, 1), "v5p:2x2x1"),
    ("v5e:2x4", 8, (2, 4), "v5e:2x4"),
    ("tpu7x:2x2x1", 8, (2, 2, 1), "tpu7x:2x2x1"),
    ("v4-32", 16, (2, 2, 4), "v4:2x2x4"),
])
def test_parse_target(target, devices, topo, name):
    sl = parse_target(target)
    assert sl.n_devices == devices and sl.topology == topo and sl.topology_name == name


@pytest.mark.parametrize("bad", ["v9-8", "v5e-7", "v5p-3", "gpu", "v5e:2x4x4", "v5e:32x32", ""])
def test_bad_targets_are_user_errors(bad):
    with pytest.raises(UserError):
        parse_target(bad)


def test_wraparound_doubles_axis_bandwidth():
    full, part = parse_target("v5e-256"), parse_target("v5e-8")
    w_full, dims_full = mesh_axis_bandwidth(full, {"data": 1, "fsdp": 16, "tensor": 16}, "fsdp")
    w_part, _ = mesh_axis_bandwidth(part, {"data": 1, "fsdp": 2, "tensor": 4}, "fsdp")
    assert dims_full == 1
    assert w_full == pytest.approx(2 * w_part)
    # an axis spanning both torus dims gets both rings
    w_both, dims_both = mesh_axis_bandwidth(full, {"data": 1, "fsdp": 256, "tensor": 1}, "fsdp")
    assert dims_both == 2 and w_both == pytest.approx(2 * w_full)


LLAMA_7B = ModelDims(name="7b", params=6_740_000_000, matmul_params=6_480_000_000, layers=32, hidden=4096,
                     heads=32, kv_heads=32, head_dim=128, ffn=11008, seq=2048, vocab=32000)


def test_flops_convention():
    m = LLAMA_7B
    assert m.flops_per_token == 6 * m.matmul_params + 12 * 32 * 2048 * 32 * 128


def test_estimate_is_consistent():
    hw = tpu_hardware("v5e-256")
    c = Candidate(data=1, fsdp=256, tensor=1, batch=1, remat="full")
    e = estimate(LLAMA_7B, c, hw)
    assert e.step_lower_s <= e.step_s <= e.step_upper_s
    assert e.compute_s > 0 and e.comm_by_axis["fsdp"] > 0 and "tensor" not in e.comm_by_axis
    # MFU = model flops / (time x devices x peak), below 1 and above 0
    assert 0 < e.mfu < 1
    assert e.mfu == pytest.approx(e.model_flops / (e.step_s * 256 * 197e12))
    # fsdp 256 shards the 16 B/param state
    assert e.memory.params + e.memory.grads + e.memory.optimizer == pytest.approx(LLAMA_7B.params * 16 / 256)


def test_remat_trades_memory_for_compute():
    hw = tpu_hardware("v5e-256")
    est = {r: estimate(LLAMA_7B, Candidate(fsdp=256, batch=2, remat=r), hw) for r in ("none", "save-dots", "full")}
    assert est["none"].memory.activations > est["save-dots"].memory.activations > est["full"].memory.activations
    assert est["full"].hfu_flops > est["none"].hfu_flops == est["save-dots"].hfu_flops
    assert est["full"].model_flops == est["none"].model_flops


def test_memory_fit_flags_impossible_candidate():
    hw = tpu_hardware("v5e-8")
    # 7B on 8 chips of 16 GB with data parallelism only: 108 GB of state per chip cannot fit
    e = estimate(LLAMA_7B, Candidate(data=8, batch=1, remat="full"), hw)
    assert not e.fits and e.memory.total > 16e9
    e2 = estimate(LLAMA_7B, Candidate(fsdp=256, batch=1, remat="full"), tpu_hardware("v5e-256"))
    assert e2.fits


def test_chunked_attention_removes_quadratic_buffer():
    hw = tpu_hardware("v6e-8")
    plain = estimate(LLAMA_7B, Candidate(fsdp=8, batch=1, remat="save-dots"), hw)
    chunked = estimate(LLAMA_7B, Candidate(fsdp=8, batch=1, remat="save-dots", attention="chunked", block=512), hw)
    assert chunked.memory.attention < plain.memory.attention / 10
    assert chunked.hfu_flops > plain.hfu_flops


def test_tensor_parallel_comm_is_exposed_fsdp_hides_and_fp32_is_slower():
    hw = tpu_hardware("v6e-8", efficiency=Efficiency())  # peaks, no overlap cost: the bare formulas
    tp = estimate(LLAMA_7B, Candidate(fsdp=4, tensor=2, batch=1, remat="full"), hw)
    assert tp.comm_exposed_s >= tp.comm_by_axis["tensor"] > 0
    bf = estimate(LLAMA_7B, Candidate(fsdp=8, batch=4, remat="full"), hw)
    # fsdp gathers hide under each layer's compute: only the first gather is exposed
    assert 0 < bf.comm_exposed_s < bf.comm_by_axis["fsdp"] / 10
    fp = estimate(LLAMA_7B, Candidate(fsdp=8, batch=4, remat="full", precision="fp32"), hw)
    assert fp.terms["matmul"] == pytest.approx(6 * bf.terms["matmul"], rel=1e-6)


def test_ring_formula_matches_reference():
    hw = tpu_hardware("v5e-8", efficiency=Efficiency())
    m = ModelDims(name="x", params=1_000_000, matmul_params=1_000_000, layers=1, hidden=128, seq=1)
    e = estimate(m, Candidate(data=8, batch=1), hw)
    v = 1_000_000 * 4  # fp32 gradients (fp32 master weights), unsharded
    w = hw.axis_bandwidth({"data": 8, "fsdp": 1, "tensor": 1}, "data")
    assert e.comm_by_axis["data"] == pytest.approx(2 * v * 7 / 8 / w + 8 / 2 * 1e-6)


def test_mxu_padding():
    assert mxu_efficiency([256, 512], 128) == 1.0
    assert mxu_efficiency([192], 128) == pytest.approx(192 / 256)
    assert math.isclose(mxu_efficiency([100], 1), 1.0)


def test_candidate_validation():
    with pytest.raises(ValueError):
        Candidate(remat="some")
    with pytest.raises(ValueError):
        Candidate(attention="chunked")
    assert Candidate(data=2, fsdp=2, batch=3).global_batch == 12


def test_model_dims_from_builtin_llama():
    from tputool.models import MODELS
    from tputool.tune.model_dims import model_dims

    spec = MODELS["llama"]
    cfg = spec.config()
    module = spec.build(cfg)
    m = model_dims("llama", module, cfg)
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.seq, m.vocab) == (2, 64, 4, 2, 32, 256)
    # tied embedding: the head matmul counts it once; norms (1-D) do not count
    assert m.matmul_params == sum(p.numel() for p in module.parameters() if p.dim() >= 2)


def test_hardware_for_visible_tpu_devices():
    from types import SimpleNamespace

    from tputool.tune.hardware import tpu_hardware_for_devices

    hw = tpu_hardware_for_devices([SimpleNamespace(device_kind="TPU v6 lite")] * 8)
    assert hw.n_devices == 8 and hw.slice.topology == (2, 4) and hw.matmul_flops["bf16"] == 918e12
    hw7 = tpu_hardware_for_devices([SimpleNamespace(device_kind="TPU7x")] * 8)
    assert hw7.slice.n_chips == 4 and hw7.n_devices == 8
    with pytest.raises(UserError):
        tpu_hardware_for_devices([SimpleNamespace(device_kind="TPU v5 lite")] * 3)
