"""Training step and inference forward of tputool's Llama, measured side by side in one run.

Rows (median wall time per step after warm-up, same weights, same batch):
  jax         the same model written directly in JAX (benchmarks/jax_llama.py), one jax.jit per step
  tpu-compile torch.compile(model, backend="tpu") forward+backward, torch.compile'd AdamW step (target <= 1.10x jax)
  torchax     torchax's extract_jax(model) inside the same JAX train step (if torchax is importable;
              pass --torchax-path DIR for a `pip install --target DIR torchax flatbuffers`, then run
              benchmarks/patch_torchax.py DIR once: torchax 0.0.13 names aten overloads this torch lacks;
              never a tputool dependency; torchax registers its own PrivateUse1 device, so a child process
              builds its programs and exports them with jax.export, and they run here, interleaved)
  cpu-eager   PyTorch eager on CPU
  cpu-inductor torch.compile (Inductor) on CPU
  tpu-strict / tpu-fused   eager on the tpu device, Strict vs Fused mode (target fused >= 1.5x faster)

Timings on a CPU-only machine measure dispatch/compile overheads and XLA:CPU, not TPU speed; read the
ratios, not the milliseconds.

    python benchmarks/train_step.py [--config tiny|small] [--batch 8] [--steps 20] [--rows jax,tpu-compile,...]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = ("jax", "tpu-compile", "torchax", "cpu-eager", "cpu-inductor", "tpu-strict", "tpu-fused")


def _load_jax_llama():
    spec = importlib.util.spec_from_file_location("jax_llama", HERE / "jax_llama.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ROUNDS = 3
"""Rows are timed in ROUNDS interleaved rounds of `steps` steps each; per row the best round's median is kept
(the machine may be shared: interleaving exposes every row to the same load)."""


def median_ms(step: Callable[[], None], steps: int) -> float:
    """Median wall time of `steps` calls of `step`, in ms."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _setup(config: str, batch: int):
    import torch

    from tputool.models import MODELS
    from tputool.models.llama import LlamaConfig

    spec = MODELS["llama"]
    cfg = LlamaConfig.small() if config == "small" else LlamaConfig.tiny()
    torch.manual_seed(0)
    model = spec.build(cfg)
    x, y = spec.example_batch(cfg, batch, "cpu", torch.Generator().manual_seed(0))
    return spec, cfg, model, x, y


def bench_jax(spec, cfg, model, x, y) -> tuple[Callable, Callable]:
    """(train step, forward) callables of the hand-written JAX model."""
    import jax
    import jax.numpy as jnp

    jl = _load_jax_llama()
    train, infer = jl.make_steps(cfg)
    state = {"p": jl.params_from_torch(model)}
    state["o"] = jl.adamw_init(state["p"])
    tx, ty = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())

    def step():
        state["p"], state["o"], loss = train(state["p"], state["o"], tx, ty)
        jax.block_until_ready(loss)

    def fwd():
        jax.block_until_ready(infer(state["p"], tx))

    return step, fwd


def bench_torch(spec, model, x, y, device: str, compile_backend: str | None,
                compile_opt: bool = False) -> tuple[Callable, Callable]:
    """(train step, forward) callables of the torch model on `device`, eager or compiled with `compile_backend`."""
    import torch

    if device == "tpu":
        from tputool.backend.graph import install

        install()  # idempotent; the device registration normally does it
    m = copy.deepcopy(model).to(device)
    xd, yd = x.to(device), y.to(device)
    fm = torch.compile(m, backend=compile_backend) if compile_backend else m

    def loss_of(a, b):
        return spec.loss_fn(m(a), b)

    floss = torch.compile(loss_of, backend=compile_backend) if compile_backend else loss_of
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    opt_step = torch.compile(opt.step, backend=compile_backend) if (compile_backend and compile_opt) else opt.step
    sync = _sync_for(device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = floss(xd, yd)  # model and loss in one graph, as in the JAX step
        loss.backward()
        opt_step()
        sync(loss)

    def fwd():
        with torch.no_grad():
            sync(fm(xd))

    return step, fwd


def _sync_for(device: str) -> Callable:
    if device != "tpu":
        return lambda t: None
    import jax

    from tputool.backend.fused import materialize
    from tputool.backend.tensor import to_jax

    def sync(t):
        materialize(t, "benchmark sync")  # no-op unless fused eager left it pending
        jax.block_until_ready(to_jax(t.detach()))

    return sync


def bench_tpu_eager(spec, model, x, y, mode_name: str) -> tuple[Callable, Callable]:
    """(train step, forward) callables in eager mode `mode_name` (DEFER_NEVER / DEFER_AND_FUSE) on tpu."""
    import torch

    mode = getattr(torch.tpu.EagerMode, mode_name)
    with torch.tpu.eager_mode(mode):
        step, fwd = bench_torch(spec, model, x, y, "tpu", None)

    def in_mode(fn):
        def run():
            with torch.tpu.eager_mode(mode):
                fn()

        return run

    return in_mode(step), in_mode(fwd)


TORCHAX_CHILD = """
import sys
sys.path.insert(0, {path!r}); sys.path.insert(0, {here!r})
import train_step as b
b.export_torchax({config!r}, {batch}, {out!r})
"""


def export_torchax(config: str, batch: int, out_dir: str) -> None:
    """Write torchax's JAX train step and forward of the torch model to `out_dir`: each a serialized
    `jax.export` module (`<name>.bin`) and its input arrays in flattening order (`<name>.npz`)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torchax

    spec, cfg, model, x, y = _setup(config, batch)
    jl = _load_jax_llama()
    weights, fn = torchax.extract_jax(model)
    tx, ty = jnp.asarray(x.numpy()), jnp.asarray(y.numpy())

    def loss_fn(w, tokens, targets):
        logits = fn(w, (tokens,))
        logp = jax.nn.log_softmax(logits.reshape(-1, logits.shape[-1]), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, targets.reshape(-1, 1), axis=-1))

    def train(w, o, tokens, targets):
        loss, g = jax.value_and_grad(loss_fn)(w, tokens, targets)
        w, o = jl.adamw_update(w, g, o)
        return w, o, loss

    def infer(w, tokens):
        return fn(w, (tokens,))

    args = (weights, jl.adamw_init(weights), tx, ty)
    np.savez(Path(out_dir) / "train.npz", *[np.asarray(a) for a in jax.tree_util.tree_leaves(args)])
    for name, f, example in (("train", train, args), ("forward", infer, (weights, tx))):
        (Path(out_dir) / f"{name}.bin").write_bytes(jax.export.export(jax.jit(f))(*example).serialize())


def _load_exported(out_dir: str) -> tuple[Callable, Callable, tuple]:
    """(jitted train step, jitted forward, the train step's inputs) written by `export_torchax`; the forward
    takes the train step's weights and tokens."""
    import jax
    import numpy as np

    train, infer = (jax.export.deserialize((Path(out_dir) / f"{n}.bin").read_bytes()) for n in ("train", "forward"))
    with np.load(Path(out_dir) / "train.npz") as z:
        leaves = [jax.device_put(z[f"arr_{i}"]) for i in range(len(z.files))]
    args, _ = jax.tree_util.tree_unflatten(train.in_tree, leaves)
    return jax.jit(train.call), jax.jit(infer.call), args


def bench_torchax(path: str | None, config: str, batch: int) -> tuple[Callable, Callable]:
    """(train step, forward) callables running torchax's programs for the torch model in this process.

    torchax registers its own PrivateUse1 device, so it cannot be imported next to tputool: a child process
    builds its JAX functions (`torchax.extract_jax` in the reference's JAX train step) and exports them with
    `jax.export`; here they are deserialized and compiled by the same XLA, so the row is timed interleaved
    with the others under the same conditions."""
    import tempfile

    import jax

    added = bool(path) and path not in sys.path
    if added:
        sys.path.append(path)  # after everything installed, while loading: flatbuffers (jax.export's format)
    try:
        with tempfile.TemporaryDirectory() as out:
            code = TORCHAX_CHILD.format(path=path or "", here=str(HERE), config=config, batch=batch, out=out)
            env = {**os.environ, "TPUTOOL_BACKEND": "0"}
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                                  timeout=1800)
            if proc.returncode != 0:
                last = (proc.stderr.strip().splitlines() or ["?"])[-1]
                raise RuntimeError(f"torchax export failed: {last}")
            train, infer, (w, o, tx, ty) = _load_exported(out)
    finally:
        if added:
            sys.path.remove(path)
    state = {"w": w, "o": o}

    def step():
        state["w"], state["o"], loss = train(state["w"], state["o"], tx, ty)
        jax.block_until_ready(loss)

    def fwd():
        jax.block_until_ready(infer(state["w"], tx))

    return step, fwd


def main(argv: list[str] | None = None) -> None:
    """Measure the selected rows and print ms/step and ratios to the JAX reference."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=["tiny", "small"], default="tiny")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--torchax-path", default=None, help="directory of a `pip install --target` torchax")
    args = ap.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = set(rows) - set(ROWS)
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; choose from {', '.join(ROWS)}")

    spec, cfg, model, x, y = _setup(args.config, args.batch)
    n, w = args.steps, args.warmup
    runs: dict[str, Callable[[], tuple]] = {
        "jax": lambda: bench_jax(spec, cfg, model, x, y),
        "tpu-compile": lambda: bench_torch(spec, model, x, y, "tpu", "tpu", compile_opt=True),
        "torchax": lambda: bench_torchax(args.torchax_path, args.config, args.batch),
        "cpu-eager": lambda: bench_torch(spec, model, x, y, "cpu", None),
        "cpu-inductor": lambda: bench_torch(spec, model, x, y, "cpu", "inductor"),
        "tpu-strict": lambda: bench_tpu_eager(spec, model, x, y, "DEFER_NEVER"),
        "tpu-fused": lambda: bench_tpu_eager(spec, model, x, y, "DEFER_AND_FUSE"),
    }
    results: dict[str, tuple | str] = {}
    for r in rows:
        try:
            results[r] = runs[r]()
            for fn in results[r]:
                for _ in range(w):
                    fn()
        except Exception as e:  # noqa: BLE001 - a row that cannot run is reported, not fatal
            if os.environ.get("BENCH_DEBUG"):
                traceback.print_exc()
            results[r] = f"n/a: {type(e).__name__}: {str(e).strip().splitlines()[0][:100] if str(e).strip() else ''}"
    timed = [r for r in rows if isinstance(results[r], tuple)]
    best = {r: [float("inf"), float("inf")] for r in timed}
    for _ in range(ROUNDS):
        for r in timed:
            for i, fn in enumerate(results[r]):
                best[r][i] = min(best[r][i], median_ms(fn, n))
    results.update({r: tuple(best[r]) for r in timed})
    print(f"llama {args.config} (dim {cfg.dim}, {cfg.n_layers} layers), batch {args.batch}x{cfg.max_seq_len}, "
          f"best of {ROUNDS} interleaved rounds' medians of {n} steps, after {w} warm-up")
    ref = results.get("jax")
    print(f"{'row':<14}{'train ms':>10}{'x jax':>8}{'fwd ms':>10}{'x jax':>8}")
    for r in rows:
        v = results[r]
        if isinstance(v, str):
            print(f"{r:<14}{v}")
            continue
        rt = f"{v[0] / ref[0]:.2f}" if isinstance(ref, tuple) else "-"
        rf = f"{v[1] / ref[1]:.2f}" if isinstance(ref, tuple) else "-"
        print(f"{r:<14}{v[0]:>10.2f}{rt:>8}{v[1]:>10.2f}{rf:>8}")
    s, f = results.get("tpu-strict"), results.get("tpu-fused")
    if isinstance(s, tuple) and isinstance(f, tuple):
        print(f"fused vs strict eager: {s[0] / f[0]:.2f}x faster (train), {s[1] / f[1]:.2f}x (forward)")


if __name__ == "__main__":
    main()
