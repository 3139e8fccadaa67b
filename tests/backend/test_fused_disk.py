"""Fused mode's disk cache (tputool.backend.fused_disk): a new process runs a step it ran before from disk,
with the same results, without tracing or compiling it again; anything wrong on disk only costs time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax

from tputool.backend import fused_disk

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
import jax
counts = {"compile": 0, "trace": 0}
def on(name, secs, **kw):
    if name.endswith("backend_compile_duration"):
        counts["compile"] += 1
    elif name.endswith("jaxpr_trace_duration"):
        counts["trace"] += 1
jax.monitoring.register_event_duration_secs_listener(on)
import torch
torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
x = torch.randn(8, 16).to("tpu")
y = torch.randint(0, 4, (8,)).to("tpu")
losses = []
counts_at_start = dict(counts)
for step in range(4):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x) * 0.5, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "compiles": counts["compile"] - counts_at_start["compile"],
                  "traces": counts["trace"] - counts_at_start["trace"],
                  "weights": [float(p.double().sum().cpu()) for p in model.parameters()]}))
"""


def _run(cache: Path | str) -> dict:
    env = {**os.environ, "TPUTOOL_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_a_second_process_runs_the_step_from_disk_with_the_same_results(tmp_path):
    cold = _run(tmp_path)
    kept = sorted(p.name.split("-")[0] for p in (tmp_path / "fused").iterdir())
    assert "shapes" in kept and "exe" in kept
    warm = _run(tmp_path)
    off = _run("off")
    assert warm["losses"] == cold["losses"] == off["losses"]
    assert warm["weights"] == cold["weights"] == off["weights"]
    assert cold["compiles"] >= 1 and cold["traces"] >= 2  # (each program traced; new nodes' shapes mostly from meta)
    # nothing traced or compiled for the steps: their shapes and programs came from disk
    assert warm["compiles"] == 0 and warm["traces"] < cold["traces"] / 4, (warm, cold)


def test_damaged_entries_are_rebuilt(tmp_path):
    cold = _run(tmp_path)
    for p in (tmp_path / "fused").iterdir():
        p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])  # truncated: unreadable JSON and pickles
    again = _run(tmp_path)  # (its programs come from JAX's own cache, which does not trace less)
    assert again["losses"] == cold["losses"]
    assert _run(tmp_path)["losses"] == cold["losses"]


def test_cache_off_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _run("off")
    assert not any(tmp_path.iterdir())


def test_keys_leave_out_what_a_new_process_cannot_name(monkeypatch, tmp_path):
    monkeypatch.setenv("TPUTOOL_CACHE_DIR", str(tmp_path))
    fused_disk.reset()
    try:
        root = fused_disk.root_key()
        assert root and fused_disk.root_key() == root
        a = fused_disk.child_key(root, ("aten.add.Tensor", (("n", 0, None), ("x", 1, (4,), "float32")), ()))
        assert a and a == fused_disk.child_key(root, ("aten.add.Tensor", (("n", 0, None), ("x", 1, (4,), "float32")), ()))
        assert a != fused_disk.child_key(root, ("aten.add.Tensor", (("n", 0, None), ("x", 1, (5,), "float32")), ()))
        assert fused_disk.child_key(root, ("op", object())) is None  # (its text holds an address)
        assert fused_disk.child_key(None, ("op",)) is None
        fused_disk.lowerings_changed()  # (a program's own lowering: nothing it affects may be kept or loaded)
        assert fused_disk.child_key(root, ("op",)) is None
    finally:
        fused_disk.reset()


def test_shapes_keep_their_structure_and_weak_types(monkeypatch, tmp_path):
    monkeypatch.setenv("TPUTOOL_CACHE_DIR", str(tmp_path))
    fused_disk.reset()
    try:
        fused_disk.root_key()
        s = jax.ShapeDtypeStruct
        out = (s((2, 3), jax.numpy.float32), None, [s((), jax.numpy.int64, weak_type=True)])
        fused_disk.remember_shapes("k", out)
        fused_disk.save_shapes()
        fused_disk.reset()
        fused_disk.root_key()
        back = fused_disk.shapes("k")
        assert type(back) is tuple and back[1] is None and type(back[2]) is list
        assert (back[0].shape, back[0].dtype, back[0].weak_type) == ((2, 3), jax.numpy.float32, False)
        assert (back[2][0].shape, back[2][0].dtype, back[2][0].weak_type) == ((), jax.numpy.int64, True)
        assert fused_disk.shapes("missing") is None
    finally:
        fused_disk.reset()


def test_a_kept_computation_called_with_other_input_types_runs_them(monkeypatch, tmp_path):
    import random

    from tputool.backend.fused import _Kept

    monkeypatch.setenv("TPUTOOL_CACHE_DIR", str(tmp_path))
    fused_disk.reset()
    n = random.randint(100, 100_000)  # (a program JAX's own persistent cache has not seen: that one is not kept)
    from jax.experimental.compilation_cache import compilation_cache

    cache_on = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)  # (nor may JAX's cache load it: same reason)
    compilation_cache.reset_cache()  # (JAX decides once per process whether its cache is used: decide again)
    try:
        fused_disk.root_key()
        kept = _Kept(jax.jit(lambda a, b: (a * b + 1,)), "k" * 32)
        x = jax.numpy.arange(n, dtype=jax.numpy.float32)
        assert kept(x, 2.0)[0][:4].tolist() == [1.0, 3.0, 5.0, 7.0] and kept._cache_size() == 1
        assert (tmp_path / "fused" / f"exe-{'k' * 32}.bin").exists()
        out = kept(x.astype(jax.numpy.float64), 2.0)[0]  # (other input types than it was compiled for)
        assert out.dtype == jax.numpy.float64 and out[:4].tolist() == [1.0, 3.0, 5.0, 7.0]
        again = _Kept(jax.jit(lambda a, b: (a * b + 1,)), "k" * 32)  # (a new process: loaded from disk)
        assert again(x, 3.0)[0][:4].tolist() == [1.0, 4.0, 7.0, 10.0] and again.jitted._cache_size() == 0
    finally:
        jax.config.update("jax_enable_compilation_cache", cache_on)
        compilation_cache.reset_cache()
        fused_disk.reset()


def test_recording_after_the_cache_was_reset_still_draws_the_same_numbers(monkeypatch, tmp_path):
    """In one process, the disk cache reset (its directory changed) between traces: recording goes on, and a
    seeded random draw gives the same numbers as before (a lost directory made recording fail over to eager)."""
    import torch

    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    torch.manual_seed(4)
    before = torch.rand(3, device="tpu").cpu()
    monkeypatch.setenv("TPUTOOL_CACHE_DIR", str(tmp_path))
    fused_disk.reset()
    from tputool.backend import events

    seen = dict(events.counts)
    try:
        torch.manual_seed(4)
        assert torch.equal(torch.rand(3, device="tpu").cpu(), before)
        torch.manual_seed(4)
        assert torch.equal((torch.rand(3, device="tpu") * 1.5 / 1.5).cpu(), before)  # (a trace new to the trie)
        failed = [d for (k, d), n in events.counts.items()
                  if k == "flush" and "could not defer" in d and n > seen.get((k, d), 0)]
        assert not failed, failed
    finally:
        fused_disk.reset()
