"""The cost model against published TPU runs (pure arithmetic: a model-accuracy test, not a timing test)."""

from __future__ import annotations

import pytest

from tputool.tune.arch import decoder_dims
from tputool.tune.candidate import Candidate
from tputool.tune.cost_model import estimate
from tputool.tune.hardware import tpu_hardware
from tputool.tune.reference import BOUND, load_runs, predict

RUNS = load_runs()


def test_reference_rows_are_data_with_sources_and_held_out_rows():
    assert len(RUNS) >= 12
    held = [r for r in RUNS if r.held_out]
    assert len(held) >= 5 and len(RUNS) - len(held) >= 5
    assert all(r.source.startswith("https://") for r in RUNS)
    issue = {("v6e-256", "llama2-70b", 0.438), ("v6e-256", "mixtral-8x7b", 0.3523),
             ("v6e-256", "mixtral-8x22b", 0.362), ("v5p:8x4x4", "mixtral-8x7b", 0.5256)}
    assert issue <= {(r.target, r.dims.name, round(r.mfu, 4)) for r in RUNS}
    assert {r.chip for r in held} == {"v5e", "v5p", "v6e"}


KNOWN_MISSES = {
    "v6e-llama3.1-405b": "held out; predicted 45% vs published 38.55% MFU (whose own 123 tok/s/chip implies "
                         "34%): the model misses what slows MaxText's 405B run",
}
"""Rows outside the bound, recorded (strict: a row that starts passing must leave this table)."""


@pytest.mark.parametrize("run", [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[r.id]))
                                 if r.id in KNOWN_MISSES else r for r in RUNS], ids=[r.id for r in RUNS])
def test_predicted_mfu_within_bound_of_published(run):
    p = predict(run)
    assert p.winner is not None, f"{run.id}: nothing fits"
    assert abs(p.ratio - 1) <= BOUND, (f"{run.id}: predicted {100 * p.mfu:.1f}% vs published "
                                       f"{100 * run.mfu:.1f}% ({p.winner.candidate.key})")
    # tokens/s per chip follows (the published figures are approximate)
    assert p.tokens_per_s_per_chip == pytest.approx(run.published_tokens_per_s_per_chip(), rel=0.3)


def test_mixtral_counts_active_experts_and_maxtext_convention_halves_causal_attention():
    m = decoder_dims("mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000,
                     seq=4096, experts=8, top_k=2, capacity=1.25)
    assert m.params == pytest.approx(46.7e9, rel=0.01) and m.active_matmul_params == pytest.approx(12.75e9, rel=0.01)
    assert m.flops_per_token - m.flops_per_token_maxtext == pytest.approx(m.attention_flops_per_token / 2)
    e = estimate(m, Candidate(fsdp=256, batch=8, remat="full", attention="flash", block=512), tpu_hardware("v6e-256"))
    assert e.mfu_maxtext < e.mfu
    assert e.hfu_flops > e.model_flops  # capacity padding and recompute are executed, not credited


def test_405b_finds_a_plan_on_one_v6e_256_slice():
    run = next(r for r in RUNS if r.id == "v6e-llama3.1-405b")
    from tputool.tune.search import tune_predicted
    from tputool.tune.space import SearchSpace

    result = tune_predicted(run.dims, tpu_hardware("v6e-256"), SearchSpace(batches=(1,), precisions=("bf16",)))
    assert result.winner is not None
    c = result.winner.candidate
    assert c.remat in ("full", "offload") and c.fsdp * c.tensor >= 64


def test_calibration_files_are_validated_and_chips_fall_back_to_default(tmp_path):
    from tputool.errors import UserError
    from tputool.tune.efficiency import Efficiency, load_calibration, write_calibration

    shipped = load_calibration()
    assert {"v5e", "v5p", "v6e", "default"} <= set(shipped)
    assert all(0 < e.attention <= e.matmul <= 0.95 for e in shipped.values())
    assert tpu_hardware("v4-8").eff == shipped["default"]  # no published v4 rows: the default entry
    path = write_calibration(tmp_path / "c.yaml", {"v6e": Efficiency(matmul=0.5)}, "test")
    assert tpu_hardware("v6e-8", calibration=str(path)).eff.matmul == 0.5
    assert tpu_hardware("v5e-8", calibration=str(path)).eff == Efficiency()  # not named, no default: peaks
    bad = tmp_path / "bad.yaml"
    bad.write_text("chips: {v6e: {matmull: 0.5}}\n")
    with pytest.raises(UserError, match="unknown field"):
        load_calibration(bad)
    with pytest.raises(UserError, match="not found"):
        load_calibration(tmp_path / "missing.yaml")
