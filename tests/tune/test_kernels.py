"""The Pallas kernel candidates (flash, splash; interpret mode on CPU) against plain attention, and how a tuned
config's kernel choice reaches `torch.compile(backend="tpu")`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tputool.backend.graph import attention_kernels as ak
from tputool.models import MODELS
from tputool.tune.candidate import ATTENTION_IMPLS, Candidate, attention_problem


def _qkv(heads: int = 2, kv_heads: int = 2, seq: int = 128, dim: int = 64, seed: int = 0):
    import jax
    import jax.numpy as jnp

    ks = jax.random.split(jax.random.PRNGKey(seed), 3)
    return (jax.random.normal(ks[0], (1, heads, seq, dim), jnp.float32),
            jax.random.normal(ks[1], (1, kv_heads, seq, dim), jnp.float32),
            jax.random.normal(ks[2], (1, kv_heads, seq, dim), jnp.float32))


@pytest.mark.parametrize(("impl", "causal", "kv_heads", "seq", "block"),
                         [("flash", True, 2, 256, 128), ("flash", False, 1, 128, 128),
                          ("splash", True, 2, 256, 128), ("splash", False, 1, 128, 128)])
def test_kernel_matches_plain_attention_values_and_grads(impl, causal, kv_heads, seq, block):
    import jax

    q, k, v = _qkv(kv_heads=kv_heads, seq=seq)
    kernel, plain = ak.attention(impl), ak.attention("plain")
    assert ak.interpret()  # CPU: the kernels run in Pallas' interpret mode

    def loss(fn):
        return lambda q, k, v: (fn(q, k, v, None, causal, 0.3, block) ** 2).sum()

    np.testing.assert_allclose(kernel(q, k, v, None, causal, 0.3, block), plain(q, k, v, None, causal, 0.3),
                               rtol=1e-5, atol=1e-5)
    got = jax.grad(loss(kernel), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


def test_unsupported_calls_and_candidate_rules():
    assert ak.unsupported("splash", 128, 256, 256, None) is None
    assert "mask" in ak.unsupported("flash", 128, 128, 128, object())
    assert "divide" in ak.unsupported("splash", 128, 192, 192, None)
    assert "unknown" in ak.unsupported("ring", 128, 128, 128, None)
    assert "float64" in ak.unsupported("flash", 128, 128, 128, None, np.float64)
    with pytest.raises(ValueError, match="divide"):
        ak.flash_attention(*_qkv(seq=96), block=64)
    assert set(ATTENTION_IMPLS) == set(ak.IMPLS)
    assert Candidate(attention="splash", block=512).key == "d1f1t1 b1 none splash/512 bf16"
    with pytest.raises(ValueError, match="block"):
        Candidate(attention="flash")
    assert attention_problem("flash", 512, 4096) is None
    assert "lane" in attention_problem("splash", 64, 4096)
    assert "divide" in attention_problem("splash", 8192, 4096)
    assert "split" in attention_problem("chunked", 4096, 4096)


def test_cli_parses_kernels_and_space_rejects_bad_blocks():
    from tputool.errors import UserError
    from tputool.tune.cli_args import parse_attention
    from tputool.tune.space import SearchSpace, enumerate_space

    assert parse_attention("plain,flash:256,splash:512") == (("plain", 0), ("flash", 256), ("splash", 512))
    with pytest.raises(UserError, match="splash needs a block size"):
        parse_attention("splash")
    from tputool.tune.api import resolve_model

    rm = resolve_model("llama", {"max_seq_len": 256})
    out = enumerate_space(rm.dims, 1, SearchSpace(batches=(1,), remats=("none",), precisions=("bf16",),
                                                  attentions=(("splash", 128), ("flash", 64), ("splash", 512))))
    assert [c.attention_label for c in out.candidates] == ["splash/128"]
    reasons = {r.what: r.reason for r in out.rejected}
    assert "lane" in reasons["d1f1t1 flash/64"] and "divide" in reasons["d1f1t1 splash/512"]


def test_tuner_lowering_with_splash_matches_torch():
    import jax
    import jax.numpy as jnp

    from tputool.tune.export import export_loss
    from tputool.tune.lower import loss_function

    spec = MODELS["llama"]
    cfg = spec.config(max_seq_len=128, n_layers=1)
    exp = export_loss(spec, cfg, 1, "fp32")
    torch.manual_seed(0)
    model = spec.build(cfg)
    x, y = spec.example_batch(cfg, 1, "cpu", torch.Generator().manual_seed(0))
    ref = float(spec.loss_fn(model(x), y).detach())
    fn = loss_function(exp, "splash", 128, "none")
    params = {k: jnp.asarray(v) for k, v in exp.params.items()}
    bufs = {k: jnp.asarray(v) for k, v in exp.buffers.items()}
    loss = jax.jit(fn)(params, bufs, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
    assert float(loss) == pytest.approx(ref, rel=1e-5)


class _Attn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(64, 64)

    def forward(self, q, k, v):
        return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("impl", ["splash", "flash"])
def test_tuned_config_kernel_reaches_compiled_sdpa(tmp_path, monkeypatch, impl):
    """`tputool run` applies the config; the script's torch.compile(backend="tpu") SDPA runs the named kernel."""
    import torch._dynamo
    import yaml

    from tputool.backend.graph import install
    from tputool.tune.config import FORMAT_VERSION, TuneConfig, clear_config
    from tputool.tune.run import run_script

    calls = []
    real = ak._BY_NAME[impl]

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setitem(ak._BY_NAME, impl, counting)
    doc = TuneConfig(Candidate(attention=impl, block=128)).to_dict()
    assert doc["tputool_tune"] == FORMAT_VERSION
    cfg_path = tmp_path / "tputool-tune.yaml"
    cfg_path.write_text(yaml.safe_dump(doc))
    out_path = tmp_path / "out.pt"
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "from tests.tune.test_kernels import _Attn\n"
        "torch.manual_seed(0)\n"
        "m = _Attn()\n"
        "q, k, v = (torch.randn(1, 2, 128, 64, requires_grad=True) for _ in range(3))\n"
        "out = torch.compile(m, backend='tpu')(q, k, v)\n"
        "out.sum().backward()\n"
        "torch.save({'out': out.detach(), 'grads': [t.grad for t in (q, k, v)]}, sys.argv[1])\n")
    install()
    torch._dynamo.reset()
    try:
        run_script(script, [str(out_path)], cfg_path)
    finally:
        clear_config()
        torch._dynamo.reset()
    assert calls, f"the compiled graph's SDPA did not use the {impl} kernel"
    got = torch.load(out_path)
    torch.manual_seed(0)
    m = _Attn()
    q, k, v = (torch.randn(1, 2, 128, 64, requires_grad=True) for _ in range(3))
    want = m(q, k, v)
    want.sum().backward()
    torch.testing.assert_close(got["out"], want.detach(), rtol=1e-4, atol=1e-4)
    for g, t in zip(got["grads"], (q, k, v), strict=True):
        torch.testing.assert_close(g, t.grad, rtol=1e-4, atol=1e-4)


def test_clear_config_restores_default_sdpa(tmp_path):
    import yaml

    from tputool.backend import runtime
    from tputool.tune.config import TuneConfig, apply_config, clear_config

    p = tmp_path / "t.yaml"
    p.write_text(yaml.safe_dump(TuneConfig(Candidate(attention="chunked", block=16)).to_dict()))
    apply_config(p)
    assert runtime.STATE.sdpa_kernel == ("chunked", 16, None)
    clear_config()
    assert runtime.STATE.sdpa_kernel is None


SHARDED = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax
from tputool.models import MODELS
from tputool.tune.candidate import Candidate
from tputool.tune.step import build_step
spec = MODELS["llama"]
cfg = spec.config(max_seq_len=128, n_layers=2)
losses = []
for attn, block in (("plain", 0), (sys.argv[1], 128)):
    c = Candidate(data=2, tensor=2, batch=1, remat="full", attention=attn, block=block, precision="fp32")
    built = build_step(spec, cfg, c, scan_layers=True)
    losses.append(float(built.fn(*built.init_args(spec, cfg))[1]))
# the compiled-graph lowering with a tuned config's mesh (shard_model sets it): per device, same values
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from tputool.backend import runtime
from tputool.backend.graph.attention_jax import sdpa_jax
from tputool.backend.graph.attention_kernels import sdpa_lowering
mesh = built.mesh
runtime.STATE.sdpa_kernel = (sys.argv[1], 128, mesh)
q, k, v = (jax.device_put(jax.random.normal(jax.random.PRNGKey(i), (4, 4, 128, 32), jnp.float32),
                          NamedSharding(mesh, P(("data", "fsdp"), "tensor"))) for i in range(3))
got = jax.jit(lambda q, k, v: sdpa_lowering(q, k, v, None, True, None, False))(q, k, v)
text = jax.jit(lambda q, k, v: sdpa_lowering(q, k, v, None, True, None, False)).lower(q, k, v).as_text()
want = sdpa_jax(q, k, v, None, True, None, False)
print(losses[0], losses[1], float(jnp.abs(got - want).max()), "shard_map" in text or "manual" in text.lower())
"""


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["splash", "flash"])
def test_kernel_runs_per_device_in_a_sharded_scanned_step(impl):
    """On a data x tensor mesh the kernel runs under shard_map (XLA cannot partition a Pallas kernel), in the
    tuner's scanned step and in compiled graphs' SDPA (~100 s each in interpret mode)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", SHARDED, impl], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plain, kernel, diff, manual = proc.stdout.split()[-4:]
    assert float(kernel) == pytest.approx(float(plain), rel=1e-5)
    assert float(diff) < 1e-4 and manual == "True"
