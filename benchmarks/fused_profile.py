"""Where a Fused eager step's time goes: recording (Python) vs the flush vs the fused XLA computation.

For the train step and the forward of tputool's Llama (the `benchmarks/train_step.py` model), after warm-up:
  nodes       ops recorded into the trace per step (and how many are view reads/reshapes of a stored value)
  record      process CPU from the step's start to its flush (every thread: the forward on the main thread,
              the backward on autograd's tpu worker thread; nothing is computing then), ms and us per node
  in mode     CPU spent inside FuseMode.__torch_dispatch__ (outermost calls, per thread): tputool's own part
              of the recording; the rest of `record` is PyTorch's frontend, autograd and the model's Python
  flush       process CPU of the flush call (jit cache hit, argument handling, dispatch, storing results)
  compute     wall time waiting for the fused computation after the flush (the benchmark's sync)
CPU times are far less sensitive to a shared machine's load than wall time.

    python benchmarks/fused_profile.py [--config small|tiny] [--batch 8] [--steps 5] [--cprofile]
"""

from __future__ import annotations

import argparse
import collections
import statistics
import threading
import time

from train_step import _setup, bench_tpu_eager


def _instrument(fused, stats: dict) -> None:
    """Wrap the mode's dispatch, the trace's add and flush to fill `stats` (per-step counters)."""
    inner = fused.FuseMode.__torch_dispatch__
    depth = threading.local()

    def dispatch(self, func, types, args=(), kwargs=None):
        if getattr(depth, "on", False):
            return inner(self, func, types, args, kwargs)
        depth.on = True
        t = time.thread_time()
        try:
            return inner(self, func, types, args, kwargs)
        finally:
            stats["mode:" + ("main" if threading.current_thread() is threading.main_thread() else "worker")] += (
                time.thread_time() - t)
            depth.on = False

    add = fused.Trace.add

    def add_counted(self, fn, fn_key, *rest):
        stats["nodes"] += 1
        if isinstance(fn_key, tuple) and fn_key[0] in ("reshape", "read", "read@"):
            stats["view nodes"] += 1
        return add(self, fn, fn_key, *rest)

    run = fused.Trace._run

    def run_timed(self, reason):
        stats["record"] += time.process_time() - stats["t0"]
        t = time.process_time()
        run(self, reason)
        stats["flush"] += time.process_time() - t
        stats["flushes"] += 1
        stats["t_flushed"] = time.perf_counter()

    fused.FuseMode.__torch_dispatch__ = dispatch
    fused.Trace.add = add_counted
    fused.Trace._run = run_timed


def main() -> None:
    """Print the per-step breakdown of Fused eager's train step and forward."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=["tiny", "small"], default="small")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cprofile", action="store_true", help="also print a cProfile of one forward's recording")
    args = ap.parse_args()

    from tputool.backend import fused

    spec, cfg, model, x, y = _setup(args.config, args.batch)
    step, fwd = bench_tpu_eager(spec, model, x, y, "DEFER_AND_FUSE")
    for _ in range(args.warmup):
        step()
        fwd()
    stats: dict = collections.Counter()
    _instrument(fused, stats)
    print(f"llama {args.config}, batch {args.batch}: medians of {args.steps} steps (CPU ms unless marked)")
    for name, fn in (("train", step), ("forward", fwd)):
        rows = collections.defaultdict(list)
        for _ in range(args.steps):
            stats.clear()
            stats["t0"] = time.process_time()
            fn()
            stats["compute"] = time.perf_counter() - stats.pop("t_flushed")
            for k, v in stats.items():
                rows[k].append(v)
        med = {k: statistics.median(v) for k, v in rows.items()}
        n = med["nodes"]
        print(f"{name}: {n:.0f} nodes ({med.get('view nodes', 0):.0f} view reads/reshapes), "
              f"{med['flushes']:.0f} flush(es)")
        print(f"  record   {med['record'] * 1e3:8.1f}   ({med['record'] / n * 1e6:.1f} us/node)")
        for k in ("mode:main", "mode:worker"):
            if k in med:
                print(f"  in mode  {med[k] * 1e3:8.1f}   ({k[5:]} thread)")
        print(f"  flush    {med['flush'] * 1e3:8.1f}")
        print(f"  compute  {med['compute'] * 1e3:8.1f}   (wall, after the flush)")
    if args.cprofile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        run = fused.Trace._run

        def run_unprofiled(self, reason):
            prof.disable()
            run(self, reason)

        fused.Trace._run = run_unprofiled
        prof.enable()
        fwd()
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
