"""SPMD sharding on 8 simulated CPU devices: sharded training equals the unsharded run.

JAX reads XLA_FLAGS once per process, so the 8-device checks run in one subprocess (the rest of the suite
keeps 1 device). It trains tputool's Llama 3 AdamW steps through torch.compile(backend="tpu") unsharded and
under data-parallel, FSDP and tensor-parallel(+FSDP) rules, and runs a compiled MLP with an activation
sharding constraint; it prints one JSON line that the tests read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tputool.errors import UserError

SCRIPT = r"""
import copy, json
import torch
from tputool.backend.graph import install, sharding as sh
from tputool.models import MODELS
import jax
install()
out = {"devices": jax.device_count()}
spec = MODELS["llama"]
cfg = spec.config(tie_embeddings=False)
torch.manual_seed(0)
ref = spec.build(cfg)
x, y = spec.example_batch(cfg, 8, "cpu", torch.Generator().manual_seed(0))

def train(rules, sizes):
    m = copy.deepcopy(ref).to("tpu")
    xd, yd = x.to("tpu"), y.to("tpu")
    if rules is not None:
        mesh = sh.topology_aware_mesh(sizes)
        sh.shard_model(m, mesh, rules)
        sh.mark_sharding(xd, mesh, sh.BATCH)
        sh.mark_sharding(yd, mesh, sh.BATCH)
    cm = torch.compile(m, backend="tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = spec.loss_fn(cm(xd), yd)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    w = m.layers[0].attn.wq.weight
    return {"losses": losses, "state": {k: v.cpu().tolist() for k, v in m.state_dict().items()},
            "wq_spec": list(getattr(sh.sharding_of(w), "spec", ())),
            "wq_grad_spec": list(getattr(sh.sharding_of(w.grad), "spec", ())),
            "wq_shard_shape": list(sh.sharding_of(w).shard_shape(tuple(w.shape)))}

import os
STRATEGIES = {"dp": (sh.REPLICATED_RULES, {"data": 8}), "fsdp": (sh.FSDP_RULES, {"data": 2, "fsdp": 4}),
              "tp": (sh.LLAMA_TP_RULES, {"data": 2, "fsdp": 2, "tensor": 2})}
out["plain"] = train(None, None)
for name in os.environ["SPMD_STRATEGIES"].split(","):
    out[name] = train(*STRATEGIES[name])

mesh = sh.topology_aware_mesh({"data": 2, "tensor": 4})
torch.manual_seed(0)
mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
class Constrained(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.hidden_sharding = sh.constraint(mesh, ("data", "tensor"))
    def forward(self, a):
        h = self.inner[1](self.inner[0](a))
        return self.inner[2](self.hidden_sharding(h))
a = torch.randn(8, 16)
expected = mlp(a)
model = Constrained(copy.deepcopy(mlp)).to("tpu")
got = torch.compile(model, backend="tpu")(a.to("tpu"))
c = sh.constraint(mesh, ("data", "tensor"))
hidden = torch.compile(lambda t: c(t * 2), backend="tpu")(torch.ones(8, 32, device="tpu"))
out["graph_breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
got.sum().backward()
out["grad_ok"] = bool(torch.isfinite(model.inner[0].weight.grad.cpu()).all())
out["constraint_max_err"] = float((got.detach().cpu() - expected.detach()).abs().max())
out["constraint_spec"] = list(sh.sharding_of(hidden).spec)
print("RESULT " + json.dumps(out))
"""


def _run(strategies: str) -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "SPMD_STRATEGIES": strategies}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def result() -> dict:
    """tp: data x fsdp x tensor at once (the CI run); dp and fsdp alone run in the slow test."""
    return _run("tp")


def _assert_same_training(a: dict, b: dict) -> None:
    import torch

    torch.testing.assert_close(torch.tensor(b["losses"]), torch.tensor(a["losses"]), rtol=1e-5, atol=1e-6)
    for k, v in a["state"].items():
        torch.testing.assert_close(torch.tensor(b["state"][k]), torch.tensor(v), rtol=1e-4, atol=1e-5, msg=k)


def test_runs_on_eight_devices(result: dict) -> None:
    assert result["devices"] == 8
    assert result["plain"]["wq_shard_shape"] == [64, 64]


def test_tensor_parallel_plus_fsdp_training_equals_unsharded(result: dict) -> None:
    _assert_same_training(result["plain"], result["tp"])
    assert result["tp"]["wq_spec"] == ["tensor", "fsdp"] and result["tp"]["wq_shard_shape"] == [32, 32]
    assert "tensor" in result["tp"]["wq_grad_spec"]  # XLA kept the gradient sharded like its parameter


@pytest.mark.slow
def test_data_parallel_and_fsdp_training_equal_unsharded() -> None:
    res = _run("dp,fsdp")
    for strategy in ("dp", "fsdp"):
        _assert_same_training(res["plain"], res[strategy])
    assert res["dp"]["wq_spec"] == [None, None] and res["dp"]["wq_shard_shape"] == [64, 64]
    assert res["fsdp"]["wq_spec"] == ["fsdp", None] and res["fsdp"]["wq_shard_shape"] == [16, 64]


def test_activation_constraint_is_applied_and_exact(result: dict) -> None:
    assert result["constraint_max_err"] < 1e-5
    assert result["constraint_spec"] == ["data", "tensor"]
    assert result["graph_breaks"] == 0 and result["grad_ok"]


def test_mesh_sizes_must_match_the_device_count() -> None:
    from tputool.backend.graph import sharding

    with pytest.raises(UserError, match="needs 2 devices"):
        sharding.topology_aware_mesh({"data": 2}, devices=[object()])
    with pytest.raises(UserError, match="unknown mesh axes"):
        sharding.topology_aware_mesh({"model": 1})


def test_spec_rules_drop_axes_that_do_not_divide() -> None:
    import jax

    from tputool.backend.graph import sharding

    mesh = jax.sharding.Mesh([[[jax.devices()[0]]]], sharding.AXES)
    assert sharding.spec_for("layers.0.attn.wq.weight", (64, 64), sharding.LLAMA_TP_RULES, mesh) == ("tensor", "fsdp")
    assert sharding.spec_for("norm.weight", (64,), sharding.FSDP_RULES, mesh) == ()


def test_a_second_run_with_the_disk_cache_warm_trains_the_same(tmp_path, monkeypatch) -> None:
    """Run again with the fused programs of the first run on disk: a one-device program loaded in a process with
    8 devices was placed on all 8 by default ("Expected args to execute_sharded_on_local_devices to have 8
    shards, got: [1, 1]"), so every 8-device script failed from its second run on."""
    monkeypatch.setenv("TPUTOOL_CACHE_DIR", str(tmp_path))
    first = _run("tp")
    assert any(tmp_path.rglob("exe-*.bin")), "the first run kept no program on disk"
    second = _run("tp")
    _assert_same_training(first["plain"], second["plain"])
    _assert_same_training(first["tp"], second["tp"])
