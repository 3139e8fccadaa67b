"""`tputool diagnose --target` on a GPT-2 124M training script (`benchmarks/target/train_gpt2.py`, nanoGPT's
real model config, fp32, DDP over the slice's chips) for v5e-8 and v6e-8 at given micro batches: the check's
time and host memory, its predicted figures, and its peak per chip against the same model's step written
directly in JAX (`benchmarks/jax_gpt2.py`) compiled for one chip of the same target (`peak_vs_jax`; the torch
step also holds DDP's buckets, `ddp_buckets_gib`, which the JAX step has no counterpart of).

    PYTHONPATH=. python benchmarks/target_check.py [--runs v5e-8:4,v6e-8:8] [--n_layer 12]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "target", "train_gpt2.py")


def jax_peak(target: str, batch: int, n_layer: int) -> tuple[int, float]:
    """The JAX reference's peak bytes on one chip of `target` (in a fresh process: JAX on CPU), and seconds."""
    root = os.path.dirname(HERE)
    code = (f"import sys; sys.path.insert(0, {root!r})\n"
            "from benchmarks.jax_gpt2 import compiled_peak_bytes\n"
            "from tputool.tune.slices import parse_target\n"
            "from tputool.tune.tpu_compile import topology_devices\n"
            "from tputool.tune.xla_log import XlaLog\n"
            "with XlaLog().capture('topology', keep_rest=False):\n"
            f"    d = topology_devices(parse_target({target!r}).topology_name)[0]\n"
            f"print(compiled_peak_bytes(d, {batch}, n_layer={n_layer}))\n")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    return int(out.stdout.split()[-1]), time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", default="v5e-8:4,v6e-8:8", help="target:micro_batch, comma-separated")
    p.add_argument("--n_layer", type=int, default=12)
    a = p.parse_args()
    from tputool.diagnose.target import check_target

    rows = []
    for run in a.runs.split(","):
        target, batch = run.split(":")
        t = check_target(SCRIPT, ["--batch_size", batch, "--n_layer", str(a.n_layer)], target)
        ref, ref_s = jax_peak(target, int(batch), a.n_layer)
        peak = t["peak_bytes_per_chip"]
        row = {"target": target, "micro_batch": int(batch), "fits": t["fits"], "peak_gib": peak and peak / 2**30,
               "jax_peak_gib": ref / 2**30, "peak_vs_jax": peak and peak / ref, "step_program": t["step_program"],
               "ddp_buckets_gib": t["live_bytes_per_chip"].get("ddp_buckets", 0) / 2**30, "programs": t["programs"],
               "compile_seconds": t["compile_seconds"], "step_compile_seconds": t["step_compile_seconds"],
               "step_ms": t.get("step_seconds", 0) * 1e3, "mfu": t.get("mfu"), "world": t["world"],
               "check_seconds": t["check_seconds"], "check_host_gib": t["check_host_max_rss_bytes"] / 2**30,
               "jax_compile_seconds": ref_s, "failed": len(t["failed"]), "error": t["error"]}
        rows.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
