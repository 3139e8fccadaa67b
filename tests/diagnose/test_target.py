"""`tputool diagnose --target SLICE` and the libtpu wheel's effect on a CPU process (extra `tpu-compile`,
which `make install` installs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("libtpu")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_PLATFORM_NAME")}
    return {**env, **extra}


def test_import_torch_with_libtpu_installed_is_quiet_and_on_cpu():
    """libtpu installed, no TPU attached: `import torch` (which starts JAX) prints nothing and JAX stays on
    CPU; compile-only TPU devices still come from a topology."""
    code = ("import torch, jax\n"
            "print((torch.ones(2, device='tpu') + 1).sum().item(), jax.devices()[0].platform)\n"
            "import sys; print('MARK', file=sys.stderr, flush=True)\n"
            "from jax.experimental import topologies\n"
            "print(len(topologies.get_topology_desc(topology_name='v5e:2x2', platform='tpu').devices))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4.0", "cpu", "4"]
    before_topology = out.stderr.split("MARK")[0]  # (get_topology_desc prints libtpu's start-up lines itself)
    assert "TPU_WORKER_HOSTNAMES" not in before_topology and "INVALID_ARGUMENT" not in before_topology


# ---- diagnose --target: the abstract run compiled for a slice ---------------------------------------------

MLP = """\
import argparse
import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--width", type=int, default=1024)
p.add_argument("--batch", type=int, default=32)
a = p.parse_args()
with torch.device("tpu"):  # built on the device: under --target its parameters hold no data
    model = nn.Sequential(nn.Linear(a.width, 4 * a.width), nn.GELU(), nn.Linear(4 * a.width, a.width))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(a.batch, a.width).to("tpu")
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print("loss", loss.item())
"""


def _mlp_params(width: int) -> int:
    return 2 * 4 * width * width + 4 * width + width


def _write(tmp_path, body: str, name: str = "train.py") -> str:
    p = tmp_path / name
    p.write_text(body)
    return str(p)


def test_a_step_that_fits_one_chip_with_its_memory_accounted(tmp_path):
    from tputool.diagnose.target import check_target

    t = check_target(_write(tmp_path, MLP), ["--batch", "32"], "v5e-1")
    p = _mlp_params(1024)
    live = t["live_bytes_per_chip"]
    # independent calculation: fp32 parameters, their gradients, AdamW's two moments
    assert live["parameters"] == 4 * p and live["gradients"] == 4 * p and live["optimizer_state"] == 8 * p
    assert t["fits"] is True and t["failed"] == [] and t["status"] == "step_limit"
    activations = 32 * (1024 + 3 * 4096 + 1024) * 4  # input, pre/post GELU, grad: a generous bound
    assert 16 * p <= t["peak_bytes_per_chip"] <= 16 * p + activations + (1 << 20)
    assert t["programs"] > 10 and t["compile_seconds"] > 0 and t["step_seconds"] > 0 and 0 < t["mfu"] < 1


def test_a_step_too_large_to_run_here_does_not_fit_a_chip(tmp_path):
    """1.2B parameters with AdamW (16 bytes each: 19 GB) on a 16 GB v5e chip; the check itself holds no data
    (its host memory stays below the parameters' 5 GB alone)."""
    # Through the CLI in a fresh process: the host figure is the peak RSS of that process's children, which in
    # this test process would include every earlier test's subprocesses.
    run = subprocess.run([sys.executable, "-m", "tputool", "diagnose", "--target", "v5e-1", "--format", "json",
                          str(_write(tmp_path, MLP)), "--", "--width", "12288", "--batch", "4"],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 1, run.stderr[-2000:]
    t = json.loads(run.stdout)["target"]
    p = _mlp_params(12288)
    assert t["fits"] is False
    assert t["peak_bytes_per_chip"] > t["hbm_bytes_per_chip"]
    assert 0.95 * 16 * p <= t["peak_bytes_per_chip"] <= 1.05 * 16 * p
    assert t["memory_by_kind"]["parameters"] == 4 * p and t["memory_by_kind"]["optimizer_state"] == 8 * p
    assert any("FSDP2" in lever for lever in t["levers"])
    assert t["check_host_max_rss_bytes"] < 4 * p


HEAD = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

with torch.device("tpu"):
    head = nn.Linear(64, 32768, bias=False)
opt = torch.optim.AdamW(head.parameters(), lr=1e-3)
for step in range(3):
    x = torch.randn(2048, 64).to("tpu")
    y = torch.randint(0, 32768, (2048,)).to("tpu")
    loss = F.cross_entropy(head(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
"""


def test_the_peak_is_the_last_step_with_its_state_counted_once(tmp_path):
    """A language-model head whose (tokens x vocab) logits dwarf its weights: the second step's peak is the
    weights, their gradients, AdamW's moments and ONE logits-sized buffer (log_softmax's output, kept for
    backward). Counting the step's start state again as outputs, or materializing nll_loss's dense gradient
    (a scatter) and its product, gave 16p + 4 logits (1.1 GB instead of 0.3 GB)."""
    from tputool.diagnose.target import check_target

    t = check_target(_write(tmp_path, HEAD), [], "v5e-1", steps=2)
    p, logits = 64 * 32768, 2048 * 32768 * 4
    assert t["fits"] is True and t["steps"] == 2
    assert 16 * p + logits // 2 <= t["peak_bytes_per_chip"] <= 16 * p + 3 * logits // 2


SHARDED = """\
import argparse
import torch
import torch.nn as nn
from tputool.tune import active_config

p = argparse.ArgumentParser()
p.add_argument("--width", type=int, default=12288)
a = p.parse_args()
with torch.device("tpu"):
    model = nn.Sequential(nn.Linear(a.width, 4 * a.width), nn.GELU(), nn.Linear(4 * a.width, a.width))
cfg = active_config()
if cfg is not None:  # `tputool run --config tputool-tune.yaml` (here: diagnose --target --config) sets it
    cfg.shard_model(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    loss = model(torch.randn(4, a.width).to("tpu")).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""

FSDP4 = """\
tputool_tune: 1
mesh: {data: 1, fsdp: 4, tensor: 1}
batch_per_shard: 4
remat: none
precision: fp32
"""


def test_a_tuned_config_shards_the_step_over_the_slice(tmp_path):
    """1.2B parameters with AdamW: 19 GB replicated does not fit a 16 GB v5e chip; the tuned config's FSDP mesh
    over the v5e-4's 4 chips shards each weight matrix (and so its gradient and moments) 4 ways: 4.8 GB per
    chip, which fits (the step's program is compiled SPMD over the 4 compile-only chips)."""
    from tputool.diagnose.target import check_target

    script = _write(tmp_path, SHARDED)
    config = tmp_path / "tputool-tune.yaml"
    config.write_text(FSDP4)
    w = 12288
    matrices, vectors = 2 * 4 * w * w, 5 * w  # the weights shard over fsdp, the biases stay replicated
    per_chip = 16 * (matrices // 4 + vectors)  # parameters, gradients, AdamW's two moments (fp32)
    t = check_target(script, [], "v5e-4", config=str(config))
    assert t["sharding"]["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1} and t["world"] == 1
    assert t["fits"] is True and t["failed"] == [] and t["error"] is None
    assert t["live_bytes_per_chip"]["parameters"] == 4 * (matrices // 4 + vectors)
    assert per_chip <= t["peak_bytes_per_chip"] <= per_chip + (64 << 20)
    replicated = check_target(script, [], "v5e-4", steps=1)  # the same script without the config
    assert replicated["fits"] is False and replicated["peak_bytes_per_chip"] >= 16 * (matrices + vectors)


def test_a_config_whose_mesh_is_larger_than_the_slice_is_refused(tmp_path):
    from tputool.diagnose.target import check_target
    from tputool.errors import UserError

    config = tmp_path / "tputool-tune.yaml"
    config.write_text(FSDP4.replace("fsdp: 4", "fsdp: 8"))
    with pytest.raises(UserError, match="needs 8 chips, v5e-4 has 4"):
        check_target(_write(tmp_path, SHARDED), [], "v5e-4", config=str(config))


ADAMW_STEPS = """\
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    loss = model(torch.randn(4, w).to("tpu")).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


FSDP2 = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group(backend="tpu")
w = 12288
with torch.device("tpu"):
    model = nn.Sequential(nn.Linear(w, 4 * w), nn.GELU(), nn.Linear(4 * w, w))
fully_shard(model[0])
fully_shard(model[2])
fully_shard(model)
""" + ADAMW_STEPS


def test_fsdp2_ranks_map_onto_the_slice_and_the_peak_is_per_chip(tmp_path):
    """The 1.2B-parameter step that does not fit one v5e chip replicated (19 GB of state), with FSDP2 over the
    v5e-4's 4 ranks: each chip holds a quarter of the parameters, gradients and AdamW's moments, plus, around
    one layer's backward, its all-gathered weight and its unsharded gradient (the next layer's prefetched weight too)
    before the reduce-scatter; at most both layers' weights and gradients unsharded at once."""
    from tputool.diagnose.target import check_target

    t = check_target(_write(tmp_path, FSDP2), [], "v5e-4")
    w = 12288
    p = 2 * 4 * w * w + 5 * w
    layer = 4 * 4 * w * w  # one Linear's fp32 weight, unsharded
    sharded = 16 * p // 4
    assert t["world"] == 4 and t["error"] is None and t["failed"] == []
    live = t["live_bytes_per_chip"]
    assert live["parameters"] == 4 * p // 4 and live["optimizer_state"] == 8 * p // 4
    assert sharded + 2 * layer <= t["peak_bytes_per_chip"] <= sharded + 4 * layer + (64 << 20)
    assert t["fits"] is True and 16 * p > t["hbm_bytes_per_chip"]  # (replicated, it could not)


TP = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

dist.init_process_group(backend="tpu")
mesh = init_device_mesh("tpu", (4,))
w = 8192
with torch.device("tpu"):
    model = nn.Sequential(nn.Linear(w, 4 * w), nn.GELU(), nn.Linear(4 * w, w))
parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
""" + ADAMW_STEPS


def test_dtensor_tensor_parallel_ranks_hold_their_shards(tmp_path):
    """DTensor used directly (tensor parallelism over a 4-chip mesh): each chip holds a quarter of both weights and
    of the first bias, the whole second bias (RowwiseParallel replicates it), AdamW's two moments of each."""
    from tputool.diagnose.target import check_target

    t = check_target(_write(tmp_path, TP), [], "v5e-4")
    w = 8192
    per_chip = 4 * (2 * w * w + w + w)  # fp32: two (w*w) weight shards, the first bias's shard, the second bias
    assert t["world"] == 4 and t["error"] is None and t["failed"] == []
    live = t["live_bytes_per_chip"]
    assert live["parameters"] == per_chip and live["optimizer_state"] == 2 * per_chip
    assert 4 * per_chip <= t["peak_bytes_per_chip"] <= 4 * per_chip + (512 << 20)  # + gradients, activations


FFT64 = """\
import torch

x = torch.randn(64, 256).to("tpu")
w = torch.nn.Parameter(torch.randn(256, device="tpu"))
opt = torch.optim.SGD([w], lr=0.1)
spectrum = torch.fft.rfft((x * w).double(), dim=-1)
loss = spectrum.abs().sum()
loss.backward()
opt.step()
"""


def test_a_float64_program_the_tpu_compiler_rejects_is_named_at_its_line(tmp_path):
    from tputool.diagnose.target import check_target, exit_status

    script = _write(tmp_path, FFT64)
    t = check_target(script, [], "v5e-1")
    lines = {(f["file"], f["line"]) for f in t["failed"]}
    assert (script, 6) in lines, t["failed"]
    assert any("FFT" in f["error"] for f in t["failed"])
    assert exit_status(t) == 1


DDP = """\
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="tpu")
world = dist.get_world_size()
model = DDP(nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).to("tpu"))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(2):
    loss = model(torch.randn(8, 512).to("tpu")).square().mean()
    if loss.item() > 1e3:
        raise SystemExit("diverged")
    loss.backward()
    opt.step()
    opt.zero_grad()
    if dist.get_rank() == 0:
        print(world, loss.item())
"""


def test_a_ddp_script_over_four_chips(tmp_path):
    """World = the slice's 4 chips; each chip holds a replica, gradients are all-reduced in DDP's buckets."""
    from tputool.diagnose.target import check_target

    t = check_target(_write(tmp_path, DDP), [], "v5e-4")
    p = 2 * 512 * 2048 + 2048 + 512
    assert t["world"] == 4 and t["fits"] is True and t["error"] is None
    assert t["collective_bytes"] == {"all-reduce": 4 * p}
    assert t["live_bytes_per_chip"]["parameters"] == 4 * p
    assert t["peak_bytes_per_chip"] >= 16 * p + 4 * p  # + DDP's flat gradient bucket
    assert t["collective_seconds"] > 0
    # the host read of the loss gets zeros, reported at its line
    assert [(a["reason"], a["line"]) for a in t["assumptions"]] == [("item", 12)]


def test_without_libtpu_target_says_how_to_install(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from tputool.cli import app
    from tputool.tune import tpu_compile

    monkeypatch.setattr(tpu_compile, "available", lambda: False)
    r = CliRunner().invoke(app, ["diagnose", "--target", "v5e-8", _write(tmp_path, MLP)])
    assert "pip install 'tputool[tpu-compile]'" in str(r.exception) and r.exception.exit_code == 2


WIDE = """\
import argparse
import torch
import torch.nn as nn

p = argparse.ArgumentParser()
p.add_argument("--micro-batch", type=int, default=4)
a = p.parse_args()
with torch.device("tpu"):
    model = nn.Sequential(nn.Linear(256, 4096), nn.GELU(), nn.Linear(4096, 256))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(a.micro_batch, 16384, 256, device="tpu")
loss = model(x).square().mean()
loss.backward()
opt.step()
"""


@pytest.mark.slow  # (~10 min on 2 busy cores: XLA rematerializes hard near the limit; `make test-all` runs it)
def test_the_largest_micro_batch_that_fits_is_found_by_compiling(tmp_path):
    """Activations dominate (two 16384 x 4096 fp32 values kept per sequence: 512 MiB); the search compiles
    smaller micro batches until the largest that fits is bracketed by one that does not."""
    from tputool.diagnose.target import check_target

    t = check_target(_write(tmp_path, WIDE), ["--micro-batch", "32"], "v5e-1", batch_arg="--micro-batch")
    assert t["fits"] is False
    best = t["largest_fitting_batch"]
    kept_per_sequence = 2 * 16384 * 4096 * 4
    assert 1 <= best <= t["hbm_bytes_per_chip"] // kept_per_sequence
    verdicts = {row["batch"]: row["fits"] for row in t["batch_tries"]}
    assert verdicts[best] is True and verdicts.get(best + 1, False) is False
    assert best + 1 in verdicts or best + 1 == 32


def test_cli_json_has_a_top_level_target_object_and_exit_status(tmp_path):
    import json

    from typer.testing import CliRunner

    from tputool.cli import app

    r = CliRunner().invoke(app, ["diagnose", "--target", "v5e-1", "--format", "json", _write(tmp_path, FFT64)])
    doc = json.loads(r.stdout[r.stdout.index("{"):])
    assert doc["target"]["slice"] == "v5e-1" and doc["target"]["failed"]
    assert r.exit_code == 1


def test_config_without_target_is_a_one_line_error(tmp_path):
    from typer.testing import CliRunner

    from tputool.cli import app

    r = CliRunner().invoke(app, ["diagnose", "--config", "tputool-tune.yaml", _write(tmp_path, MLP)])
    assert "--config applies with --target" in str(r.exception) and r.exception.exit_code == 2


def test_the_live_state_scan_skips_weak_proxies_whose_object_died() -> None:
    """`diagnose --target` on nanochat failed at its first optimizer step ("ReferenceError: weakly-referenced object
    no longer exists"): `isinstance` on a dead `weakref.proxy` among the collector's objects raises."""
    import weakref

    import torch

    from tputool.diagnose.target_run import _live

    class Held:
        pass

    obj = Held()
    proxy = weakref.proxy(obj)
    del obj
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    assert opt in list(_live(torch.optim.Optimizer)) and type(proxy) in weakref.ProxyTypes


def test_levers_come_largest_memory_first() -> None:
    """nanochat d12 at micro batch 32 on a v5e chip: 86 GiB of activations against 0.7 GiB of parameters; the
    activations' lever comes first, each with the memory it addresses."""
    from tputool.diagnose.target import levers

    got = levers({"parameters": 756 << 20, "gradients": 700 << 20, "optimizer_state": 1200 << 20,
                  "activations": 86 << 30, "other": 6 << 20})
    assert [lever.split(" (")[0] for lever in got] == ["activations", "optimizer state", "parameters", "gradients"]
    assert got[0].startswith("activations (86.00 GiB): recompute activations")
