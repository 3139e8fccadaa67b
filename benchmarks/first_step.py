"""First step and steady step of a small training loop, per execution mode, each first step in a fresh process.

Models: `gpt2` (a nanoGPT-family GPT-2 of this file's own, ported style: `.to("tpu")`; 2 layers, 64 wide,
B=4, T=64, vocab 512; AdamW betas 0.9/0.95, weight decay 0.1 on matrices, gradient clipping at 1.0) and
`llama` (the built-in `tputool.models` Llama, tiny config). Rows:
  cpu-eager    PyTorch eager on CPU (steady step: the faster of PyTorch's default threads and one thread, timed
               alternately: on this 2-core machine two threads slow down many times over while another process
               holds a core)
  cpu-mode     cpu-eager under a pass-through Python dispatch mode (`TorchDispatchMode` whose
               `__torch_dispatch__` only calls the op): what any per-op recorder written in Python pays before
               recording anything, with CPU's kernels still doing the work
  tpu-strict   eager on the tpu device, Strict mode (EagerMode.DEFER_NEVER)
  tpu-fused    eager on the tpu device, Fused mode (EagerMode.DEFER_AND_FUSE)
  tpu-compile  torch.compile(loss, backend="tpu"), eager AdamW
  jax          the same model written in JAX (benchmarks/jax_gpt2.py / jax_llama.py), one jax.jit per step

Per row and model, each in a new Python process: the first step with an EMPTY cache directory (cold), then
again in another new process with the same directory (warm: whatever persistent cache the mode uses), and in
the warm process the steady step (median of --steps). Columns:
  compiled   XLA backend compiles before the first step finished (JAX's own monitoring event; a persistent
             cache hit is not a compile), cold process
  launches   device programs launched in one steady step, as the backend counts them (`events.total("launch")`:
             Strict per-op and view kernels, Fused flushes, compiled graph calls); `jax` is 1 by
             construction, `cpu-eager` none
Rows are interleaved (round-robin), ROUNDS rounds; the best round per row is kept. Ratios against
cpu-eager and jax. On a CPU-only machine this measures dispatch and compile overheads on XLA:CPU.

    python benchmarks/first_step.py [--models gpt2,llama] [--rows ...] [--steps 10] [--rounds 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = ("cpu-eager", "cpu-mode", "tpu-strict", "tpu-fused", "tpu-compile", "jax")
MODELS = ("gpt2", "llama")
GPT2 = {"n_layer": 2, "n_head": 4, "d": 64, "vocab": 512, "block": 64, "batch": 4}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---- the ported GPT-2 script (our own, nanoGPT family) ---------------------------------------------------

def _gpt2_torch():
    import math

    import torch
    from torch import nn
    from torch.nn import functional as F

    c = GPT2

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            d = c["d"]
            self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
            self.register_buffer("mask", torch.tril(torch.ones(c["block"], c["block"], dtype=torch.bool)))

        def forward(self, x):
            b, t, d = x.shape
            h = c["n_head"]
            q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
            att = att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(dim=-1)
            x = x + self.c_proj((att @ v).transpose(1, 2).contiguous().view(b, t, d))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(c["vocab"], c["d"]), nn.Embedding(c["block"], c["d"])
            self.h = nn.ModuleList(Block() for _ in range(c["n_layer"]))
            self.ln_f = nn.LayerNorm(c["d"])

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.h:
                x = blk(x)
            return self.ln_f(x) @ self.wte.weight.t()

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    torch.manual_seed(0)
    model = GPT()
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, c["vocab"], (c["batch"], c["block"]), generator=g)
    y = torch.randint(0, c["vocab"], (c["batch"], c["block"]), generator=g)
    return model, loss_fn, x, y


def _optimizer(model):
    import torch

    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=6e-4, betas=(0.9, 0.95))


def _torch_setup(model_name: str):
    if model_name == "gpt2":
        return _gpt2_torch()
    import torch

    from tputool.models import MODELS as BUILTIN
    from tputool.models.llama import LlamaConfig

    spec = BUILTIN["llama"]
    cfg = LlamaConfig.tiny()
    torch.manual_seed(0)
    model = spec.build(cfg)
    x, y = spec.example_batch(cfg, 4, "cpu", torch.Generator().manual_seed(0))
    return model, spec.loss_fn, x, y


# ---- the child: one row, one process ---------------------------------------------------------------------

def _torch_step(row: str, model_name: str):
    import torch

    model, loss_fn, x, y = _torch_setup(model_name)
    device = "cpu" if row.startswith("cpu") else "tpu"
    if device == "tpu":
        import tputool.backend  # noqa: F401  (registers the device)
        mode = torch.tpu.EagerMode.DEFER_AND_FUSE if row == "tpu-fused" else torch.tpu.EagerMode.DEFER_NEVER
        torch.tpu.set_eager_mode(mode)
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    opt = _optimizer(model)

    def loss_of(a, b):
        return loss_fn(model(a), b)

    floss = torch.compile(loss_of, backend="tpu") if row == "tpu-compile" else loss_of

    def step():
        opt.zero_grad(set_to_none=True)
        loss = floss(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss.item())  # the script's own sync: it logs the loss

    if row != "cpu-mode":
        return step
    from torch.utils._python_dispatch import TorchDispatchMode

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def step_in_mode():
        with PassThrough():
            return step()

    return step_in_mode


def _jax_step(model_name: str):
    import jax
    import jax.numpy as jnp
    import numpy as np

    if model_name == "gpt2":
        jg = _load("jax_gpt2")
        c = GPT2
        shapes = jg.param_shapes(c["n_layer"], c["d"], c["vocab"], c["block"])
        rng = np.random.default_rng(0)
        params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.02, s.shape), jnp.float32), shapes)
        zeros = jax.tree.map(jnp.zeros_like, params)
        opt = (zeros, jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))
        fn = jax.jit(jg.train_step, static_argnums=4, donate_argnums=(0, 1))
        g = np.random.default_rng(1)
        x = jnp.asarray(g.integers(0, c["vocab"], (c["batch"], c["block"])), jnp.int32)
        y = jnp.asarray(g.integers(0, c["vocab"], (c["batch"], c["block"])), jnp.int32)
        state = {"p": params, "o": opt}

        def step():
            state["p"], state["o"], loss = fn(state["p"], state["o"], x, y, c["n_head"])
            return float(loss)

        return step
    model, _, x, y = _torch_setup("llama")
    jl = _load("jax_llama")
    from tputool.models.llama import LlamaConfig

    train = jl.make_clipped_train_step(LlamaConfig.tiny())  # the same step as _torch_step's loop
    state = {"p": jl.params_from_torch(model)}
    state["o"] = jl.adamw_init(state["p"])
    tx, ty = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())

    def step():
        state["p"], state["o"], loss = train(state["p"], state["o"], tx, ty)
        return float(loss)

    return step


def child(row: str, model_name: str, steps: int) -> dict:
    """Run one row in this (fresh) process; the cache directory comes from the environment."""
    t_start = time.perf_counter()
    import jax

    compiles = [0]

    def on_duration(name: str, _secs: float, **_: object) -> None:
        if name.endswith("backend_compile_duration"):
            compiles[0] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    if row == "jax":
        jax.config.update("jax_compilation_cache_dir", os.environ["TPUTOOL_CACHE_DIR"] + "/xla")
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
        step = _jax_step(model_name)
    else:
        step = _torch_step(row, model_name)
    events = None
    if row.startswith("tpu"):
        from tputool.backend import events  # the backend's launch counter: events.total("launch")
    t0 = time.perf_counter()
    loss0 = step()
    first = time.perf_counter() - t0
    compiled = compiles[0]
    for _ in range(2):
        step()
    threads = [None]
    if row.startswith("cpu"):
        import torch

        threads = [torch.get_num_threads(), 1] if torch.get_num_threads() > 1 else [1]
    times: dict = {n: [] for n in threads}
    for _ in range(steps):
        for n in threads:  # (alternately)
            if n is not None:
                torch.set_num_threads(n)
            t = time.perf_counter()
            step()
            times[n].append(time.perf_counter() - t)
    medians = {n: statistics.median(v) for n, v in times.items()}
    fastest = min(medians, key=medians.get)
    per_step = None
    if events is not None:
        before = events.total("launch")
        step()
        per_step = events.total("launch") - before
    elif row == "jax":
        per_step = 1
    return {"first_s": first, "setup_s": t0 - t_start, "steady_ms": medians[fastest] * 1e3,
            "compiled": compiled, "launches": per_step, "loss0": loss0, "threads": fastest}


def _run_child(row: str, model_name: str, steps: int, cache: str) -> dict:
    env = dict(os.environ, TPUTOOL_CACHE_DIR=cache, PYTHONPATH=str(HERE.parent) + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, __file__, "--child", row, model_name, str(steps)], env=env,
                       capture_output=True, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        return {"error": (p.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--child", nargs=3, metavar=("ROW", "MODEL", "STEPS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child[0], a.child[1], int(a.child[2]))))
        return 0
    rows, models = a.rows.split(","), a.models.split(",")
    bad = [r for r in rows if r not in ROWS] + [m for m in models if m not in MODELS]
    if bad:
        print(f"first_step.py: unknown row or model {bad[0]!r} (rows: {', '.join(ROWS)}; models: gpt2, llama)",
              file=sys.stderr)
        return 2
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"on {os.cpu_count()} cores", flush=True)
    best: dict = {}
    for _ in range(a.rounds):
        for m in models:
            for r in rows:  # interleaved: every row of a round sees the same load
                with tempfile.TemporaryDirectory() as cache:
                    cold = _run_child(r, m, a.steps, cache)
                    warm = _run_child(r, m, a.steps, cache)
                res = {"cold": cold, "warm": warm}
                old = best.get((m, r))
                if old is None or ("error" not in cold and "error" not in warm and
                                   cold["first_s"] < old["cold"].get("first_s", float("inf"))):
                    best[(m, r)] = res
    for m in models:
        print(f"\n{m}: first step (fresh process) and steady step; ratios vs cpu-eager / jax")
        print(f"{'row':12} {'cold s':>8} {'warm s':>8} {'steady ms':>10} {'xCPU':>6} {'xJAX':>6} "
              f"{'cold/jax':>8} {'warm/jax':>8} {'compiled':>8} {'launches':>8}  threads")
        ref = {r: best.get((m, r)) for r in ("cpu-eager", "jax")}

        def val(r, key, phase, ref=ref):
            v = (ref.get(r) or {}).get(phase, {})
            return v.get(key)

        for r in rows:
            res = best[(m, r)]
            c, w = res["cold"], res["warm"]
            if "error" in c or "error" in w:
                print(f"{r:12} error: {c.get('error') or w.get('error')}")
                continue

            def ratio(x, y):
                return f"{x / y:.2f}" if y else "-"

            print(f"{r:12} {c['first_s']:8.2f} {w['first_s']:8.2f} {w['steady_ms']:10.1f} "
                  f"{ratio(w['steady_ms'], val('cpu-eager', 'steady_ms', 'warm')):>6} "
                  f"{ratio(w['steady_ms'], val('jax', 'steady_ms', 'warm')):>6} "
                  f"{ratio(c['first_s'], val('jax', 'first_s', 'cold')):>8} "
                  f"{ratio(w['first_s'], val('jax', 'first_s', 'warm')):>8} "
                  f"{c['compiled']:8d} {str(w['launches'] if w['launches'] is not None else '-'):>8}  "
                  f"{w.get('threads') or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
