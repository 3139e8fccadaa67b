"""The sparse MoE expert layer per device of a mesh (each device sorts and groups its own tokens, under
shard_map): on 4 simulated CPU devices with the batch sharded, the ragged and gmm (Pallas interpret mode)
layers equal the dense layer, values and gradients, as a JAX function, in the tuner's sharded step, and in a
torch.compile(backend="tpu") graph once a tuned config's shard_model made the mesh.

JAX reads XLA_FLAGS once per process, so the checks run in one subprocess that prints one JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, tempfile
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from tputool.backend.graph import moe_experts as me
from tputool.mesh import axis_mesh

out = {"devices": jax.device_count()}
B, S, D, F, E, K = 4, 8, 16, 32, 4, 2
ks = jax.random.split(jax.random.PRNGKey(0), 6)
x = jax.random.normal(ks[0], (B, S, D), jnp.float32)
probs = jax.nn.softmax(jax.random.normal(ks[1], (B, S, E), jnp.float32), axis=-1)
top_w, top_i = jax.lax.top_k(probs, K)
top_w = top_w / top_w.sum(-1, keepdims=True)
w1, w3 = (0.2 * jax.random.normal(k, (E, D, F), jnp.float32) for k in ks[2:4])
w2 = 0.2 * jax.random.normal(ks[4], (E, F, D), jnp.float32)

def dense(x, top_w, w1, w3, w2):
    gates = (jax.nn.one_hot(top_i, E) * top_w[..., None]).sum(-2)
    h = jax.nn.silu(jnp.einsum("btd,edf->btef", x, w1)) * jnp.einsum("btd,edf->btef", x, w3)
    return jnp.einsum("btef,efd,bte->btd", h, w2, gates)

want = jax.value_and_grad(lambda *a: jnp.sum(dense(*a) ** 2), argnums=range(5))(x, top_w, w1, w3, w2)

def err(got):
    return max(float(jnp.abs(g - w).max()) for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))

local = []  # the token shapes one device groups (traced inside the map)
real_one = me.one_device
me.one_device = lambda x, *a: local.append(list(x.shape)) or real_one(x, *a)
for name, sizes in (("df", {"data": 2, "fsdp": 2}), ("dt", {"data": 2, "tensor": 2})):
    mesh = axis_mesh(sizes, jax.devices())
    tokens = NamedSharding(mesh, P(("data", "fsdp")))
    xs, ws, ids = (jax.device_put(a, tokens) for a in (x, top_w, top_i))
    for impl in ("ragged", "gmm"):
        def sparse(x, top_w, w1, w3, w2, top_i, impl=impl, mesh=mesh):
            with me.on_mesh(mesh):
                return me.experts(x, top_w, top_i, w1, w3, w2, impl=impl)
        step = jax.jit(jax.value_and_grad(lambda *a: jnp.sum(sparse(*a) ** 2), argnums=range(5)))
        local.clear()
        text = step.lower(xs, ws, w1, w3, w2, ids).as_text()
        out[f"{impl}-{name}"] = {"err": err(step(xs, ws, w1, w3, w2, ids)), "local": local[0],
                                 "per_device": "manual" in text.lower()}
me.one_device = real_one

# the tuner's sharded step: a data x fsdp candidate's two-step losses (the second reads the gradients)
from tputool.models import MODELS
from tputool.tune.candidate import Candidate
from tputool.tune.step import build_step
spec = MODELS["moe"]
cfg = spec.config(n_layers=1, max_seq_len=16)
out["step"] = {}
for name, c in (("dense", Candidate(data=2, fsdp=2, batch=1, precision="fp32", moe="dense")),
                ("ragged", Candidate(data=2, fsdp=2, batch=1, precision="fp32", moe="ragged")),
                ("gmm", Candidate(data=2, fsdp=2, batch=1, precision="fp32", moe="gmm")),
                ("gmm-tensor", Candidate(data=2, tensor=2, batch=2, precision="fp32", moe="gmm"))):
    built = build_step(spec, cfg, c, scan_layers=True)
    state, xs, ys = built.init_args(spec, cfg)
    losses = []
    for _ in range(2):
        state, loss = built.fn(state, xs, ys)
        losses.append(float(loss))
    out["step"][name] = {"losses": losses, "per_device": "manual" in built.lower().as_text().lower()}

# a compiled graph after a tuned config's shard_model: the layer runs per device of the config's mesh
import torch, yaml
import tputool.backend  # noqa: F401
from tputool.backend import runtime
from tputool.models.moe import MoEFeedForward
from tputool.tune.config import TuneConfig, apply_config

torch.manual_seed(0)
ref = MoEFeedForward(dim=16, ffn_dim=32, n_experts=4, top_k=2, dispatch="dense")
xt = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(1))

def run(layer, xin):
    xin = xin.detach().requires_grad_()
    y = layer(xin)
    (y * y).sum().backward()
    return [y.detach().cpu(), xin.grad.cpu()] + [p.grad.cpu() for p in layer.parameters()]

want_t = run(ref, xt)
calls = []
real = me.per_device
me.per_device = lambda *a: calls.append(a[1].shape) or real(*a)
out["compiled"] = {}
for m in ("ragged", "gmm"):
    path = tempfile.mktemp(suffix=".yaml")
    with open(path, "w") as f:
        yaml.safe_dump(TuneConfig(Candidate(data=2, fsdp=2, batch=1, moe=m), model="moe").to_dict(), f)
    cfg_t = apply_config(path)
    layer = MoEFeedForward(dim=16, ffn_dim=32, n_experts=4, top_k=2)
    layer.load_state_dict(ref.state_dict())
    layer = layer.to("tpu")
    cfg_t.shard_model(layer)
    calls.clear()
    got = run(torch.compile(layer, backend="tpu"), xt.to("tpu"))
    out["compiled"][m] = {"err": max(float((g - w).abs().max()) for g, w in zip(got, want_t)),
                          "mesh": [dict(s) for s in calls], "state_mesh": runtime.STATE.moe_mesh is not None}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def result() -> dict:
    """The subprocess' measurements on 4 simulated CPU devices."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("impl", ["ragged", "gmm"])
@pytest.mark.parametrize(("mesh", "local"), [("df", [1, 8, 16]), ("dt", [2, 4, 16])])
def test_per_device_layer_equals_dense_values_and_grads(result: dict, impl: str, mesh: str, local: list) -> None:
    """data x fsdp: each device groups its batch row; data x tensor: half a batch row's sequence."""
    assert result["devices"] == 4
    got = result[f"{impl}-{mesh}"]
    assert got["per_device"] and got["local"] == local  # ran under shard_map on its own tokens
    assert got["err"] < 1e-4


def test_tuners_sharded_step_trains_like_dense(result: dict) -> None:
    steps = result["step"]
    for m in ("ragged", "gmm", "gmm-tensor"):
        assert steps[m]["per_device"]
        assert steps[m]["losses"] == pytest.approx(steps["dense"]["losses"], rel=1e-5)


@pytest.mark.parametrize("impl", ["ragged", "gmm"])
def test_compiled_layer_runs_per_device_of_the_configs_mesh(result: dict, impl: str) -> None:
    got = result["compiled"][impl]
    assert got["state_mesh"]
    assert got["mesh"] and all(m == {"data": 2, "fsdp": 2, "tensor": 1} for m in got["mesh"])
    assert got["err"] < 1e-4
