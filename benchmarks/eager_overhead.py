"""Per-op cost of the bundled `tpu` backend in Strict eager mode, next to a direct jitted JAX call and CPU eager.

For each op and size, two measures, each in `--rounds` rounds that alternate the columns (a shared machine's
load changes hit all of them alike), reporting the median:
  waited     `--iters` calls one by one, each waited for (torch.tpu.synchronize for tpu, block_until_ready
             for JAX): the latency of one op, including the wake-up of the thread that runs it;
  pipelined  bursts of `--burst` calls and one wait at the end, per call: what an eager loop that does not
             read values back pays per op (JAX and the tpu device run asynchronously).
The ratios tpu/jax are the backend's overhead over calling JAX yourself (target: within 2x).

    .venv/bin/python benchmarks/eager_overhead.py [--iters 300] [--rounds 10] [--burst 20] [--sizes 64,512]
        [--mode DEFER_NEVER] [--torch-threads 1]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import torch

OPS: dict[str, tuple[Callable, Callable, int]] = {
    # name: (torch fn, jax fn, number of inputs)
    "add": (torch.add, jnp.add, 2),
    "mul": (torch.mul, jnp.multiply, 2),
    "matmul": (torch.matmul, jnp.matmul, 2),
    "relu": (torch.relu, jax.nn.relu, 1),
    "sum": (torch.sum, jnp.sum, 1),
    "softmax": (lambda x: torch.softmax(x, dim=-1), lambda x: jax.nn.softmax(x, axis=-1), 1),
}


def _timed(fn: Callable, args: list, wait: Callable[[object], object], iters: int, burst: int) -> list[float]:
    """Seconds per call: `iters` waited calls (burst 1), or ceil(iters / burst) bursts of `burst` calls whose
    outputs are all kept and waited for together (so every call is computed, in every mode)."""
    times = []
    if burst <= 1:
        for _ in range(iters):
            t0 = time.perf_counter()
            wait(fn(*args))
            times.append(time.perf_counter() - t0)
        return times
    for _ in range(bursts_for(iters, burst)):
        t0 = time.perf_counter()
        outs = [fn(*args) for _ in range(burst)]
        wait(outs)
        times.append((time.perf_counter() - t0) / burst)
        del outs
    return times


def bursts_for(iters: int, burst: int) -> int:
    """Bursts of `burst` calls that cover `iters` calls (at least one)."""
    return max(1, -(-iters // burst))


def _interleaved_us(cols: list[tuple[Callable, list, Callable]], iters: int, warmup: int, rounds: int,
                    burst: int = 1) -> list[float]:
    """Median microseconds per call of each (fn, args, wait) column, timed in `rounds` alternating rounds (so a
    load change on a shared machine hits every column alike); `burst` > 1 times pipelined bursts."""
    for fn, args, wait in cols:
        for _ in range(warmup):
            wait(fn(*args))
    per_round = max(1, iters // rounds)
    samples: list[list[float]] = [[] for _ in cols]
    for _ in range(rounds):
        for s, (fn, args, wait) in zip(samples, cols, strict=True):
            for _ in range(min(10, warmup)):
                wait(fn(*args))
            s.extend(_timed(fn, args, wait, per_round, burst))
    return [statistics.median(s) * 1e6 for s in samples]


def _tpu_wait(_out: object) -> None:
    torch.tpu.synchronize()


def _jax_wait(out: jax.Array | list) -> None:
    jax.block_until_ready(out)


def _no_wait(_out: object) -> None:
    return None


def measure(sizes: list[int], iters: int, warmup: int, rounds: int = 10, burst: int = 20) -> list[dict]:
    """One row per (op, size): median microseconds per call for torch CPU, jitted JAX and torch tpu, waited
    one by one and pipelined in bursts of `burst`."""
    rows = []
    gen = torch.Generator().manual_seed(0)
    for name, (tfn, jfn, arity) in OPS.items():
        for n in sizes:
            cpu_args = [torch.randn(n, n, generator=gen) for _ in range(arity)]
            tpu_args = [a.to("tpu") for a in cpu_args]
            jax_args = [jnp.asarray(a.numpy()) for a in cpu_args]
            jitted = jax.jit(jfn)
            cols = [(tfn, cpu_args, _no_wait), (jitted, jax_args, _jax_wait), (tfn, tpu_args, _tpu_wait)]
            cpu_us, jax_us, tpu_us = _interleaved_us(cols, iters, warmup, rounds)
            jax_pipe, tpu_pipe = _interleaved_us(cols[1:], iters, warmup, rounds, burst)
            torch.testing.assert_close(tfn(*tpu_args).cpu(), tfn(*cpu_args), rtol=1e-4, atol=1e-3)
            rows.append({"op": name, "size": f"{n}x{n}", "cpu_us": cpu_us, "jax_us": jax_us, "tpu_us": tpu_us,
                         "tpu_over_jax": tpu_us / jax_us, "jax_pipelined_us": jax_pipe,
                         "tpu_pipelined_us": tpu_pipe, "pipelined_tpu_over_jax": tpu_pipe / jax_pipe})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, measure, print the table (and write JSON); exit 1 if no tpu device."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--rounds", type=int, default=10,
                   help="the iterations are split into this many rounds, alternating cpu/jax/tpu")
    p.add_argument("--burst", type=int, default=20, help="calls per wait in the pipelined measure")
    p.add_argument("--sizes", default="64,512")
    p.add_argument("--mode", default="DEFER_NEVER", help="torch.tpu.EagerMode member to measure")
    p.add_argument("--json", default=None, help="also write the rows to this JSON file")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="torch.set_num_threads for the CPU column (1 avoids oversubscription on a busy machine)")
    args = p.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    if not hasattr(torch, "tpu"):
        print("error: no tpu device (the bundled backend did not load)", file=sys.stderr)
        return 1
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, args.mode))
    rows = measure([int(s) for s in args.sizes.split(",")], args.iters, args.warmup, args.rounds, args.burst)
    per_round = max(1, args.iters // args.rounds)
    piped = args.rounds * bursts_for(per_round, args.burst) * args.burst
    print(f"eager mode {args.mode}, jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}, "
          f"torch threads {torch.get_num_threads()}; us per call, medians over {args.rounds} interleaved rounds: "
          f"{per_round * args.rounds} calls waited one by one, {piped} pipelined in bursts of {args.burst}")
    print(f"{'':<18}{'---------- waited ----------':>40}{'----- pipelined -----':>29}")
    print(f"{'op':<9}{'size':>9}{'torch cpu':>11}{'jax jit':>10}{'tpu':>10}{'tpu/jax':>9}"
          f"{'jax jit':>10}{'tpu':>10}{'tpu/jax':>9}")
    for r in rows:
        print(f"{r['op']:<9}{r['size']:>9}{r['cpu_us']:>11.1f}{r['jax_us']:>10.1f}{r['tpu_us']:>10.1f}"
              f"{r['tpu_over_jax']:>8.2f}x{r['jax_pipelined_us']:>10.1f}{r['tpu_pipelined_us']:>10.1f}"
              f"{r['pipelined_tpu_over_jax']:>8.2f}x")
    for label, key in (("waited", "tpu_over_jax"), ("pipelined", "pipelined_tpu_over_jax")):
        ratios = [r[key] for r in rows]
        within = sum(x <= 2.0 for x in ratios)
        print(f"tpu/jax {label}: median {statistics.median(ratios):.2f}x, max {max(ratios):.2f}x; "
              f"{within}/{len(rows)} within 2x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": args.mode, "iters": args.iters, "rounds": args.rounds, "burst": args.burst,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
