"""The torch model lowered to JAX for tuning: same loss and grads as torch; the knobs change what runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from tputool.models import MODELS
from tputool.tune.export import export_loss


@pytest.fixture(scope="module")
def llama():
    spec = MODELS["llama"]
    cfg = spec.config()
    return spec, cfg, export_loss(spec, cfg, 2, "fp32")


def torch_reference(spec, cfg):
    torch.manual_seed(0)
    model = spec.build(cfg)
    x, y = spec.example_batch(cfg, 2, "cpu", torch.Generator().manual_seed(0))
    loss = spec.loss_fn(model(x), y)
    loss.backward()
    return float(loss), {n: p.grad.numpy() for n, p in model.named_parameters()}, (x, y)


def test_export_keeps_attention_and_finds_layers(llama):
    _, _, exp = llama
    targets = {str(n.target) for n in exp.graph_module.graph.nodes if n.op == "call_function"}
    assert "aten.scaled_dot_product_attention.default" in targets
    assert set(exp.layer_of.values()) == {None, "layers.0", "layers.1"}
    # the tied embedding/head weight is one parameter
    assert "tok_emb.weight" in exp.params and "head.weight" not in exp.params


@pytest.mark.parametrize(("attention", "block", "remat"), [("plain", 0, "none"), ("chunked", 8, "save-dots"),
                                                           ("chunked", 16, "full")])
def test_lowered_loss_and_grads_match_torch(llama, attention, block, remat):
    import jax
    import jax.numpy as jnp

    from tputool.tune.lower import loss_function

    spec, cfg, exp = llama
    ref_loss, ref_grads, (x, y) = torch_reference(spec, cfg)
    fn = loss_function(exp, attention, block, remat)
    params = {k: jnp.asarray(v) for k, v in exp.params.items()}
    bufs = {k: jnp.asarray(v) for k, v in exp.buffers.items()}
    loss, grads = jax.jit(jax.value_and_grad(fn))(params, bufs, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
    assert float(loss) == pytest.approx(ref_loss, rel=1e-5)
    for name, g in grads.items():
        np.testing.assert_allclose(np.asarray(g), ref_grads[name], rtol=1e-3, atol=1e-6)


def test_chunked_attention_matches_plain():
    import jax

    from tputool.tune.attention import chunked_attention, plain_attention

    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(k1, (2, 4, 32, 8))
    k = jax.random.normal(k2, (2, 2, 32, 8))
    v = jax.random.normal(k3, (2, 2, 32, 8))
    for causal in (False, True):
        np.testing.assert_allclose(chunked_attention(q, k, v, causal=causal, block=8),
                                   plain_attention(q, k, v, causal=causal), rtol=1e-5, atol=1e-5)


def test_remat_recomputes_and_chunking_cuts_compiled_memory():
    """XLA's own numbers: full remat adds the recomputed forward's FLOPs, chunked attention needs less
    temporary memory. (XLA:CPU schedules recomputation early, so remat's memory saving only shows when
    compiling for TPU.)"""
    import jax

    from tputool.tune.candidate import Candidate
    from tputool.tune.step import build_step

    spec = MODELS["llama"]
    cfg = spec.config(max_seq_len=64)

    def compiled(**kw):
        built = build_step(spec, cfg, Candidate(batch=4, **kw), devices=jax.devices()[:1])
        return built.lower().compile()

    none, full = compiled(remat="none"), compiled(remat="full")
    chunked = compiled(remat="none", attention="chunked", block=16)
    flops = {k: c.cost_analysis()["flops"] for k, c in (("none", none), ("full", full))}
    assert flops["full"] > 1.15 * flops["none"]
    temp = {k: c.memory_analysis().temp_size_in_bytes for k, c in (("none", none), ("chunked", chunked))}
    assert temp["chunked"] < 0.8 * temp["none"]


def test_measure_one_candidate_in_process():
    """Compile, run and profile one real candidate on one device; the numbers come from the trace."""
    import jax

    from tputool.tune.candidate import Candidate
    from tputool.tune.measure import measure
    from tputool.tune.step import build_step

    spec = MODELS["llama"]
    cfg = spec.config()
    m = measure(build_step(spec, cfg, Candidate(batch=2), devices=jax.devices()[:1]), spec, cfg, steps=2)
    assert 0 < m.step_s <= m.step_median_s
    assert m.compute_s > 0 and m.collective_s == 0 and m.compile_s > 0
    assert m.hlo_flops and m.temp_bytes > 0 and np.isfinite(m.loss)
    # the analytic FLOP count (6N + attention, per device) agrees with XLA's own count of the step
    from tputool.tune.cost_model import estimate
    from tputool.tune.model_dims import model_dims

    e = estimate(model_dims("llama", spec.build(cfg), cfg), Candidate(batch=2), _host())
    assert 0.8 < m.hlo_flops / e.hfu_flops < 1.5


def _host():
    from tputool.tune.hardware import Hardware

    return Hardware(name="cpu", n_devices=1, matmul_flops={"bf16": 1e10, "fp32": 1e10}, hbm_bytes=1e9,
                    hbm_bw=1e10, link_bw=1e9, collective_latency_s=1e-5, kind="cpu")


MEASURED = textwrap.dedent("""
    import json, os, sys, tempfile
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    from typer.testing import CliRunner
    from tputool.cli import app
    out = os.path.join(sys.argv[1], "tputool-tune.yaml")
    args = ["tune", "--cpu-devices", "8", "--model", "llama", "--batch", "1", "--remat", "none,full",
            "--attention", "plain", "--precision", "bf16", "--mesh", "d8f1t1,d2f4t1,d4f1t2", "--steps", "2",
            "--hbm-gb", sys.argv[2], "--out", out]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, (r.output, repr(r.exception))
    p = CliRunner().invoke(app, ["profile", "--model", "llama", "--config", out, "--steps", "2",
                                 "--out", os.path.join(sys.argv[1], "trace")])
    assert p.exit_code == 0, (p.output, repr(p.exception))
    print(json.dumps({"tune": r.output, "profile": p.output}))
""")


@pytest.mark.slow
def test_measured_tune_then_profile_on_8_simulated_devices(tmp_path):
    """End to end in a fresh process: measured search, YAML, then profiling the winner's step (~1 min)."""
    import yaml

    # 1.2 MB per device: the tiny llama's larger-batch, no-remat candidates do not fit
    proc = subprocess.run([sys.executable, "-c", MEASURED, str(tmp_path), "0.0012"], capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    doc = yaml.safe_load((tmp_path / "tputool-tune.yaml").read_text())
    search = doc["search"]
    assert search["run"] <= search["candidates"] // 3
    assert doc["mode"] == "measured" and doc["measured"]["step_s"] > 0
    assert doc["mesh"]["data"] * doc["mesh"]["fsdp"] * doc["mesh"]["tensor"] == 8
    flagged = [r for r in search["rejected"] if r["stage"] == "memory"]
    assert flagged and all("/device >" in r["reason"] for r in flagged)
    assert "CPU measurements" in out["tune"]
    assert "collective / device / step" in out["profile"] and "Perfetto" in out["profile"]
