"""The first training step and the steady step of tputool's tiny Llama, each row in fresh processes.

Rows (the model, batch and AdamW step of benchmarks/train_step.py; one process per row and cache state):
  cpu-eager    PyTorch eager on CPU
  tpu-strict   eager on the tpu device, Strict mode (the default)
  tpu-fused    eager on the tpu device, Fused mode (ops deferred to one program per sync)
  tpu-compile  torch.compile(backend="tpu") model+loss, eager AdamW
  jax          the same model written directly in JAX, one jax.jit per step (the floor)
Each row runs twice per round: `cold` with an empty JAX persistent compilation cache directory, `warm` with the
directory the cold run filled (JAX_COMPILATION_CACHE_DIR is set for every row alike, so eager per-op programs are
cached too). Per run: the first step's wall time (from the model on the device to the loss ready), the median
steady step, the XLA programs compiled before the first step ends (JAX's backend compiles) and loaded from the
persistent cache, and, in Fused mode, the fused programs launched per steady step (flushes).

Timings on a CPU-only machine measure dispatch and XLA:CPU compile overheads, not TPU speed: read the ratios.
Rounds are interleaved, so load from other processes falls on every row alike.

    python benchmarks/first_step.py [--config tiny|small] [--batch 4] [--steps 10] [--rounds 2] [--rows ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROWS = ("cpu-eager", "tpu-strict", "tpu-fused", "tpu-compile", "jax")


def _child(row: str, config: str, batch: int, steps: int) -> dict:
    """Run one row in this (fresh) process and return its figures."""
    import jax

    counts = {"compiled": 0, "cache_hits": 0}

    def on_duration(name: str, *_a, **_k) -> None:
        if name == "/jax/core/compile/backend_compile_duration":
            counts["compiled"] += 1

    def on_event(name: str, **_k) -> None:
        if name == "/jax/compilation_cache/cache_hits":
            counts["cache_hits"] += 1

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    jax.monitoring.register_event_listener(on_event)
    sys.path.insert(0, str(HERE))
    import train_step as b

    spec, cfg, model, x, y = b._setup(config, batch)
    if row == "jax":
        step, _ = b.bench_jax(spec, cfg, model, x, y)
    elif row == "cpu-eager":
        step, _ = b.bench_torch(spec, model, x, y, "cpu", None)
    elif row == "tpu-compile":
        step, _ = b.bench_torch(spec, model, x, y, "tpu", "tpu")
    else:
        step, _ = b.bench_tpu_eager(spec, model, x, y, "DEFER_NEVER" if row == "tpu-strict" else "DEFER_AND_FUSE")
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    compiled, hits = counts["compiled"], counts["cache_hits"]
    step()  # the second step may still compile (optimizer state exists from here on)
    flushes = None
    if row.startswith("tpu"):
        from tputool.backend import events

        before = sum(n for (kind, _), n in events.counts.items() if kind == "flush")
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    if row == "tpu-fused":
        after = sum(n for (kind, _), n in events.counts.items() if kind == "flush")
        flushes = (after - before) / steps
    return {"first_s": first, "steady_ms": statistics.median(times) * 1e3, "compiled_first": compiled,
            "cache_hits_first": hits, "compiled_later": counts["compiled"] - compiled,
            "launches_per_step": flushes}


def run_row(row: str, cache: Path, args: argparse.Namespace) -> dict:
    """One row in a fresh process with JAX's persistent cache in `cache`."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache), "TPUTOOL_CACHE_DIR": str(cache.parent),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
           "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, __file__, "--child", row, "--config", args.config, "--batch", str(args.batch),
           "--steps", str(args.steps)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="tiny", choices=("tiny", "small"))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.config, args.batch, args.steps)))
        return
    rows = args.rows.split(",")
    unknown = sorted(set(rows) - set(ROWS))
    if unknown:
        sys.exit(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    results: dict[tuple[str, str], list[dict]] = {}
    base = Path(tempfile.mkdtemp(prefix="tputool-first-step-"))
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    try:
        for r in range(args.rounds):
            for row in rows:  # interleaved: every row once per round
                cache = base / f"{row}-{r}" / "xla"
                for state in ("cold", "warm"):
                    results.setdefault((row, state), []).append(run_row(row, cache, args))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")

    def best(row: str, state: str, key: str) -> float | None:
        vals = [d[key] for d in results[(row, state)] if d.get(key) is not None]
        return min(vals) if vals else None

    jax_cold, jax_warm = (best("jax", s, "first_s") if "jax" in rows else None for s in ("cold", "warm"))
    cpu_steady = best("cpu-eager", "cold", "steady_ms") if "cpu-eager" in rows else None
    print(f"{'row':12} {'first cold s':>12} {'/jax':>5} {'first warm s':>12} {'/jax':>5} {'steady ms':>9} {'/cpu':>5} "
          f"{'compiled':>8} {'from cache':>10} {'launches/step':>13}")
    for row in rows:
        errs = [d["error"] for s in ("cold", "warm") for d in results[(row, s)] if "error" in d]
        if errs:
            print(f"{row:12} failed: {errs[0]}")
            continue
        fc, fw = best(row, "cold", "first_s"), best(row, "warm", "first_s")
        st = min(best(row, "cold", "steady_ms"), best(row, "warm", "steady_ms"))
        launches = best(row, "cold", "launches_per_step")

        def ratio(a: float | None, b: float | None) -> str:
            return f"{a / b:5.2f}" if a is not None and b else "    -"

        print(f"{row:12} {fc:12.2f} {ratio(fc, jax_cold)} {fw:12.2f} {ratio(fw, jax_warm)} {st:9.1f} "
              f"{ratio(st, cpu_steady)} {best(row, 'cold', 'compiled_first'):8.0f} "
              f"{best(row, 'warm', 'cache_hits_first'):10.0f} {'-' if launches is None else f'{launches:.1f}':>13}")


if __name__ == "__main__":
    main()
