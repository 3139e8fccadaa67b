"""Compile-only TPU checks (optional extra `tpu-compile`: the libtpu wheel); skipped where it is absent."""

from __future__ import annotations

import dataclasses

import pytest

from tputool.tune.candidate import Candidate

pytest.importorskip("libtpu")


def test_compile_for_v5e_topology_reports_tpu_memory():
    from tputool.tune import tpu_compile
    from tputool.tune.api import resolve_model
    from tputool.tune.hardware import tpu_hardware

    # parameters and AdamW state dominate (the scanned step's temporaries of a tiny model are noise)
    rm = resolve_model("llama", {"dim": 512, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "ffn_dim": 1408,
                                 "vocab_size": 8192, "max_seq_len": 128})
    check = tpu_compile.compile_checker(rm, tpu_hardware("v5e:2x4"))
    small = check(Candidate(fsdp=8, batch=1))
    bigger = check(Candidate(data=8, batch=8))
    assert 0 < small < bigger < 16e9


@pytest.mark.slow
def test_real_out_of_memory_is_flagged():
    """A 1.6B-parameter llama replicated on 16 GB v5e chips: the TPU compiler itself says it does not fit."""
    from tputool.tune import tpu_compile
    from tputool.tune.api import resolve_model
    from tputool.tune.hardware import tpu_hardware
    from tputool.tune.search import tune_predicted
    from tputool.tune.space import SearchSpace

    rm = resolve_model("llama", {"dim": 4096, "n_layers": 6, "n_heads": 32, "n_kv_heads": 8, "ffn_dim": 11008,
                                 "max_seq_len": 512, "vocab_size": 32000})
    hw = tpu_hardware("v5e:2x4")
    hw_lying = dataclasses.replace(hw, hbm_bytes=1e15)  # the cost model alone would let everything through
    space = SearchSpace(batches=(1,), remats=("full",), attentions=(("plain", 0),), precisions=("bf16",),
                        meshes=((8, 1, 1),))
    result = tune_predicted(rm.dims, hw_lying, space, rm.param_shapes, tpu_compile.compile_checker(rm, hw), top=1)
    row = result.rows[0]
    assert row.status == "memory", row.reason


def test_pallas_kernel_candidates_compile_natively_for_a_topology():
    """flash/splash candidates lower as Mosaic kernels (per device, under shard_map) for compile-only TPU
    devices, in the scanned step; XLA's warnings go to the log, not the terminal."""
    from tputool.tune import tpu_compile
    from tputool.tune.api import resolve_model
    from tputool.tune.hardware import tpu_hardware
    from tputool.tune.xla_log import XlaLog

    rm = resolve_model("llama", {"max_seq_len": 256, "dim": 256, "n_heads": 2, "n_kv_heads": 1})
    log = XlaLog()
    check = tpu_compile.compile_checker(rm, tpu_hardware("v5e:2x4"), log)
    for impl in ("splash", "flash"):
        assert 0 < check(Candidate(data=4, tensor=2, batch=1, remat="full", attention=impl, block=128)) < 16e9


def test_moe_gmm_candidates_compile_per_device_on_a_mesh():
    """The megablox gmm MoE layer compiles natively for a 4-chip topology on an fsdp and a data mesh of 4
    (per device, under shard_map: XLA cannot partition a Mosaic kernel)."""
    from tputool.tune import tpu_compile
    from tputool.tune.api import resolve_model
    from tputool.tune.hardware import tpu_hardware

    rm = resolve_model("moe", {"n_layers": 2, "max_seq_len": 128})
    check = tpu_compile.compile_checker(rm, tpu_hardware("v5e:2x2"))
    for data, fsdp in ((1, 4), (4, 1)):
        c = Candidate(data=data, fsdp=fsdp, batch=2, remat="full", precision="bf16", moe="gmm")
        assert 0 < check(c) < 16e9


def test_compile_top_sets_how_many_candidates_compile_and_0_compiles_none(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from tputool.cli import app
    from tputool.tune import tpu_compile

    compiled = []
    monkeypatch.setattr(tpu_compile, "compile_checker",
                        lambda rm, hw, log=None: lambda c: compiled.append(c.key) or 1e9)
    args = ["tune", "--model", "llama", "--target", "v5e-8", "--batch", "1,2", "--remat", "none",
            "--attention", "plain", "--precision", "bf16", "--out", str(tmp_path / "t.yaml")]
    for top, count in ((2, 2), (0, 0)):
        compiled.clear()
        r = CliRunner().invoke(app, [*args, "--compile-top", str(top)])
        assert r.exit_code == 0, r.output
        assert len(compiled) == count
        assert ("--compile-top 0: memory fit and times are estimated" in r.output) == (top == 0)
    r = CliRunner().invoke(app, [*args, "--compile-top", "-1"])
    assert r.exit_code == 2
