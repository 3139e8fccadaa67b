"""Search-space enumeration, pruning budget, memory flags and Spearman, with a synthetic runner."""

from __future__ import annotations

import dataclasses

import pytest

from tputool.tune.candidate import Candidate, ModelDims
from tputool.tune.hardware import Hardware
from tputool.tune.measure import Measurement
from tputool.tune.search import spearman, tune_measured
from tputool.tune.space import SearchSpace, enumerate_space, meshes

DIMS = ModelDims(name="toy", params=400_000, matmul_params=380_000, layers=2, hidden=128, heads=4, kv_heads=2,
                 head_dim=32, ffn=256, seq=64, vocab=512)


def fake_hw(hbm: float = 1e9) -> Hardware:
    return Hardware(name="fake x8", n_devices=8, matmul_flops={"bf16": 1e10, "fp32": 1e10}, hbm_bytes=hbm,
                    hbm_bw=1e10, link_bw=1e9, collective_latency_s=1e-5, kind="cpu")


def test_meshes_cover_every_factorisation():
    ms = meshes(8)
    assert len(ms) == 10 and all(d * f * t == 8 for d, f, t in ms)
    assert len(set(ms)) == 10


def test_enumeration_respects_divisibility_and_records_why():
    enum = enumerate_space(DIMS, 8, SearchSpace(batches=(1,), remats=("none",), attentions=(("plain", 0),),
                                                precisions=("bf16",)))
    tensors = {c.tensor for c in enum.candidates}
    assert tensors == {1, 2}  # kv_heads=2 rules out tensor 4 and 8
    reasons = {r.what: r.reason for r in enum.rejected}
    assert "kv_heads=2 not divisible by tensor=4" in reasons["mesh d2f1t4"]
    assert "heads=4 not divisible by tensor=8" in reasons["mesh d1f1t8"]


def test_chunk_block_must_split_seq():
    enum = enumerate_space(DIMS, 8, SearchSpace(batches=(1,), remats=("none",),
                                                attentions=(("chunked", 48), ("chunked", 16)), precisions=("bf16",)))
    assert {c.block for c in enum.candidates} == {16}
    assert any("block 48 does not split seq 64" in r.reason for r in enum.rejected)


def synthetic_run(log: list):
    """Step time from a fixed formula of the candidate (stands in for hardware), recording what ran."""
    def run(c: Candidate) -> Measurement:
        log.append(c)
        step = 0.01 * c.batch * (1.3 if c.remat == "full" else 1.0) * (1.5 if c.precision == "fp32" else 1.0) \
            + 0.004 * (c.tensor - 1) + 0.002
        return Measurement(step, step, step * 0.8, step * 0.1, step * 0.1, 1.0, 0, 0, None, 1.0)
    return run


def test_measured_search_runs_at_most_a_third_and_never_a_misfit():
    space = SearchSpace(batches=(1, 4, 64), remats=("none", "full"), attentions=(("plain", 0),),
                        precisions=("bf16", "fp32"))
    log: list = []
    # 40 MB per device: batch 64 without remat cannot fit
    result = tune_measured(DIMS, fake_hw(hbm=40e6), space, synthetic_run(log))
    n = len(result.rows)
    assert len(log) <= n // 3 and len(log) == len(result.measured) == result.budget
    misfits = [r for r in result.rows if r.status == "memory"]
    assert misfits and all(r.candidate not in log for r in misfits)
    assert all("/device >" in r.reason for r in misfits)
    assert all(r.reason.startswith("predicted rank") for r in result.rows if r.status == "pruned")
    best = max(result.measured, key=lambda r: r.measured_tokens_per_s)
    assert result.winner is best


def test_failures_are_recorded_not_raised():
    space = SearchSpace(batches=(1,), remats=("none",), attentions=(("plain", 0),), precisions=("bf16",))

    def boom(c):
        raise RuntimeError("compile exploded\nsecond line")

    result = tune_measured(DIMS, fake_hw(), space, boom, fraction=1.0)
    assert result.winner is None
    assert all(r.status == "failed" and r.reason == "RuntimeError: compile exploded" for r in result.rows)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486832980505138)


def test_attention_defaults_scale_with_the_sequence():
    from tputool.tune.space import default_attentions

    long = default_attentions(8192)
    assert ("plain", 0) not in long  # a (8192 x 8192) score matrix per head is not a default
    assert long and all(impl == "chunked" and 512 <= blk < 8192 and 8192 % blk == 0 for impl, blk in long)
    assert {impl for impl, _ in default_attentions(8192, kernels=True)} == {"chunked", "flash", "splash"}
    short = default_attentions(64)
    assert ("plain", 0) in short and all(blk in (0, 16) for _, blk in short)


def test_global_batch_sets_the_batch_per_mesh_and_tpu_plans_stay_predicted():
    dims = dataclasses.replace(DIMS, seq=256)  # a Pallas kernel block is a multiple of 128 dividing seq
    space = SearchSpace(global_batch=8, remats=("full", "offload"), attentions=(("plain", 0), ("flash", 128)),
                        precisions=("bf16",))
    enum = enumerate_space(dims, 8, space)
    assert enum.candidates and all(c.global_batch == 8 for c in enum.candidates)
    # measured mode runs a kernel asked for by name (interpret mode off TPU), never a TPU-only remat plan
    assert {(c.remat, c.attention) for c in enum.candidates} == {("full", "plain"), ("full", "flash")}
    assert any("predicted mode (--target) only" in r.reason for r in enum.rejected)
    predicted = enumerate_space(dims, 8, space, kernels=True)
    assert {c.attention for c in predicted.candidates} == {"plain", "flash"}
    assert {c.remat for c in predicted.candidates} == {"full", "offload"}
    reasons = {r.what: r.reason for r in enumerate_space(dims, 16, space, kernels=True).rejected}
    assert reasons["mesh d16f1t1"] == "global batch 8 does not split over data x fsdp = 16"
