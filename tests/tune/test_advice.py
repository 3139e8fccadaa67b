"""When nothing fits: the reasons (memory by part against HBM) and the smallest change that fits."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tputool.cli import app
from tputool.errors import UserError
from tputool.tune.arch import decoder_dims
from tputool.tune.hardware import tpu_hardware
from tputool.tune.search import tune_predicted
from tputool.tune.space import SearchSpace

LLAMA2_70B = decoder_dims("llama2-70b", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000,
                          seq=4096)
LLAMA31_8B = decoder_dims("llama3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256,
                          seq=8192)


def test_state_too_big_suggests_more_chips():
    result = tune_predicted(LLAMA2_70B, tpu_hardware("v5e-8"), SearchSpace(batches=(1,), precisions=("bf16",)))
    assert result.winner is None and result.no_fit is not None
    closest = result.no_fit.closest[0]
    assert closest.needed > closest.available
    assert closest.dominant == "params+grads+optimizer"  # 70B x 16 B/param over 8 chips of 16 GiB
    change = result.no_fit.change
    assert change is not None and change.what.startswith("more chips: v5e-")
    # the suggestion was checked: searching the suggested slice finds a plan
    bigger = change.what.split()[2]
    assert tune_predicted(LLAMA2_70B, tpu_hardware(bigger), SearchSpace(batches=(1,), precisions=("bf16",))).winner


def test_activations_too_big_suggests_full_remat_first():
    space = SearchSpace(batches=(16,), remats=("none", "save-dots"), precisions=("bf16",))
    result = tune_predicted(LLAMA31_8B, tpu_hardware("v5e-256"), space)
    assert result.winner is None
    assert result.no_fit.closest[0].dominant == "activations"
    assert result.no_fit.change.what.startswith("full remat")
    lines = "\n".join(result.no_fit.lines())
    assert "no candidate fits in memory" in lines and "smallest change that fits: full remat" in lines


def test_global_batch_too_big_suggests_a_smaller_one():
    space = SearchSpace(global_batch=256 * 64, remats=("full",), precisions=("bf16",))
    result = tune_predicted(LLAMA31_8B, tpu_hardware("v5e-256"), space)
    assert result.winner is None
    assert "global batch of" in result.no_fit.change.what


def test_cli_nothing_fits_exits_nonzero_with_reasons(tmp_path, monkeypatch):
    monkeypatch.setattr("tputool.tune.tpu_compile.available", lambda: False)
    out = tmp_path / "t.yaml"
    res = CliRunner().invoke(app, ["tune", "--model", "llama", "--target", "v5e-8", "--set", "dim=8192",
                                   "--set", "n_layers=80", "--set", "n_heads=64", "--set", "n_kv_heads=8",
                                   "--set", "ffn_dim=28672", "--set", "max_seq_len=4096", "--set",
                                   "vocab_size=32000", "--batch", "1", "--precision", "bf16", "--out", str(out)])
    assert res.exit_code != 0
    assert isinstance(res.exception, UserError) and "nothing fits" in str(res.exception)
    assert "no candidate fits in memory" in res.output and "params+grads+optimizer" in res.output
    assert "smallest change that fits: more chips" in res.output
    assert not out.exists()


@pytest.mark.parametrize(("target", "chips", "dcn"), [("v5e-256x2", 512, 2), ("v6e-256x4", 1024, 4)])
def test_multi_slice_targets_cross_dcn_on_the_outer_axis(target, chips, dcn):
    from tputool.tune.slices import dcn_part, parse_target

    sl = parse_target(target)
    assert sl.n_chips == chips and sl.name == target
    mesh = {"data": dcn, "fsdp": 256 // dcn, "tensor": dcn}
    assert dcn_part(sl, mesh, "data") == dcn and dcn_part(sl, mesh, "fsdp") == dcn_part(sl, mesh, "tensor") == 1
    hw = tpu_hardware(target)
    # the same all-reduce over an axis of the same size costs more across slices (DCN) than inside one (ICI)
    inside = hw.collective_s(mesh, "tensor", "all-reduce", 1e9)
    across = hw.collective_s(mesh, "data", "all-reduce", 1e9)
    assert across > 3 * inside


def test_when_the_top_candidates_do_not_fit_compiled_the_next_ones_are_compiled():
    """The cost model's memory estimate can be low; the compile check then goes on down the ranking (a fake check:
    the first four candidates in rank order run out of HBM, the fifth fits)."""
    from tputool.tune.search import COMPILE_MORE

    hw = tpu_hardware("v5e-8")
    small = decoder_dims("llama-1b", layers=16, hidden=2048, heads=16, kv_heads=8, ffn=5632, vocab=32000, seq=2048)
    seen: list = []

    def check(candidate):
        seen.append(candidate)
        if len(seen) <= 4:
            raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM")
        return hw.hbm_bytes / 2

    result = tune_predicted(small, hw, SearchSpace(precisions=("bf16",)), compile_check=check, top=3)
    ranked = [r for r in result.rows if r.candidate in seen]
    assert len(seen) == 5 and result.winner is not None and result.winner.candidate == seen[4]
    assert [r.status for r in ranked] == ["memory"] * 4 + ["compiled"]

    def never_fits(candidate):
        raise RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM")

    none_fit = tune_predicted(small, hw, SearchSpace(precisions=("bf16",)), compile_check=never_fits, top=2)
    assert none_fit.winner is None
    assert sum(r.status == "memory" and (r.reason or "").startswith("compile") for r in none_fit.rows) \
        == COMPILE_MORE * 2  # (then it stops: no winner)
