"""Does the cost-model-pruned tuner find what exhaustive search finds? (8 simulated CPU devices)

Measures EVERY candidate of a small search space for a Llama (the exhaustive search), then replays the
tuner on those measurements: it may only look at the cost model's top third. Prints
- the tuner's choice against the exhaustive best (target: within 5% while running at most a third),
- Spearman rank correlation of predicted against measured throughput (all candidates, and the third run),
- predicted memory against XLA's compiled memory analysis, and a memory limit under which misfits are
  flagged before anything runs.
All times are CPU measurements on simulated devices: they check the machinery, they do not rank TPU
strategies (see shared/reference/tpu-tuning.md).

    python benchmarks/tune_search.py [--cache /tmp/tune_cache.json] [--fraction 0.3333] [--steps 3]

`--wall BASE_REV [--rounds N]` instead times the default command a user runs, `tputool tune --model llama
--cpu-devices 8`, end to end (a fresh process each time): BASE_REV checked out in a temporary git worktree,
then this checkout, interleaved N rounds, with the load average around each run.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

warnings.filterwarnings("ignore")

MODEL = {"dim": 128, "ffn_dim": 256, "max_seq_len": 64, "vocab_size": 512, "n_layers": 2}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=None, help="JSON file of measurements to reuse/extend")
    ap.add_argument("--fraction", type=float, default=1 / 3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--precisions", default="bf16", help="comma list: bf16,fp32 doubles the space")
    ap.add_argument("--wall", metavar="BASE_REV", default=None, help="time the default tune command: BASE_REV vs this")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    if args.wall:
        return wall(args.wall, args.rounds)

    import jax

    from tputool.tune.api import measured_runner, resolve_model
    from tputool.tune.calibrate import calibrate_host
    from tputool.tune.measure import Measurement
    from tputool.tune.search import predict_all, spearman, tune_measured
    from tputool.tune.space import SearchSpace

    space = SearchSpace(batches=(1, 4), remats=("none", "full"), attentions=(("plain", 0), ("chunked", 16)),
                        precisions=tuple(args.precisions.split(",")))
    rm = resolve_model("llama", MODEL)
    hw = calibrate_host(jax.devices())
    rows, _ = predict_all(rm.dims, hw, space, rm.param_shapes)
    print(f"llama {MODEL}: {len(rows)} candidates on {hw.name} (CPU measurements, simulated devices)")

    cache: dict[str, dict] = {}
    if args.cache and os.path.exists(args.cache):
        cache = json.load(open(args.cache))
    run = measured_runner(rm, steps=args.steps)
    t0 = time.perf_counter()
    for i, r in enumerate(rows, 1):
        key = r.candidate.key
        if key not in cache:
            try:
                cache[key] = run(r.candidate).to_dict()
            except Exception as e:  # noqa: BLE001 - a failing candidate is reported, not fatal
                cache[key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            if args.cache:
                json.dump(cache, open(args.cache, "w"))
        m = cache[key]
        shown = f"{m['step_s'] * 1e3:7.1f} ms" if "step_s" in m else m["error"][:60]
        print(f"  [{i:3d}/{len(rows)}] {key:36s} {shown}", flush=True)
    print(f"exhaustive search: {time.perf_counter() - t0:.0f} s of measuring (cached entries are free)")

    measured = {k: Measurement(**v) for k, v in cache.items() if "step_s" in v}
    ok = [r for r in rows if r.candidate.key in measured]
    tok = {r.candidate.key: r.estimate.tokens_per_step / measured[r.candidate.key].step_s for r in ok}
    best = max(ok, key=lambda r: tok[r.candidate.key])
    looked: list[str] = []

    def replay(c):
        looked.append(c.key)
        if c.key not in measured:
            raise RuntimeError(cache[c.key]["error"])
        return measured[c.key]

    result = tune_measured(rm.dims, hw, space, replay, args.fraction, rm.param_shapes)
    chosen = result.winner
    ratio = tok[chosen.candidate.key] / tok[best.candidate.key]
    rho_all = spearman([r.estimate.tokens_per_s for r in ok], [tok[r.candidate.key] for r in ok])
    rho_run = result.spearman()
    print()
    print(f"exhaustive best : {best.candidate.key:36s} {tok[best.candidate.key]:10,.0f} tok/s")
    print(f"tuner's choice  : {chosen.candidate.key:36s} {tok[chosen.candidate.key]:10,.0f} tok/s "
          f"= {100 * ratio:.1f}% of best (target >= 95%)")
    print(f"candidates run  : {len(looked)} of {len(rows)} ({100 * len(looked) / len(rows):.0f}%, limit 33%)")
    print(f"Spearman(predicted, measured): all {len(ok)} = {rho_all:.2f}; the {len(result.measured)} run = "
          f"{'n/a' if rho_run is None else f'{rho_run:.2f}'}")

    held_out = [r for r in result.rows if r.status == "pruned" and r.candidate.key in measured]
    if len(held_out) >= 3:
        rho_out = spearman([r.estimate.tokens_per_step / r.corrected_step_s for r in held_out],
                           [tok[r.candidate.key] for r in held_out])
        rho_prior_out = spearman([r.estimate.tokens_per_s for r in held_out], [tok[r.candidate.key] for r in held_out])
        print(f"on the {len(held_out)} candidates the tuner did NOT run: Spearman roofline = {rho_prior_out:.2f}, "
              f"roofline corrected by the {len(result.measured)} measurements = {rho_out:.2f}")
    plain = tune_measured(rm.dims, hw, space, lambda c: measured[c.key], args.fraction, rm.param_shapes,
                          refine=False)
    print(f"without measurement corrections (roofline top third only): choice {plain.winner.candidate.key} = "
          f"{100 * tok[plain.winner.candidate.key] / tok[best.candidate.key]:.1f}% of best")

    xla = [(r.estimate.memory.total, measured[r.candidate.key].temp_bytes + measured[r.candidate.key].argument_bytes)
           for r in ok]
    print(f"Spearman(predicted memory, XLA memory_analysis) = {spearman([a for a, _ in xla], [b for _, b in xla]):.2f}"
          f"; median predicted/XLA = {sorted(a / b for a, b in xla if b)[len(xla) // 2]:.2f}")

    mems = sorted(r.estimate.memory.total for r in rows)
    limit = mems[len(mems) // 2]
    tight = dataclasses.replace(hw, hbm_bytes=limit)
    looked.clear()
    flagged_result = tune_measured(rm.dims, tight, space, replay, args.fraction, rm.param_shapes)
    flagged = [r.candidate.key for r in flagged_result.rows if r.status == "memory"]
    overlap = set(flagged) & set(looked)
    example = next((r for r in flagged_result.rows if r.status == "memory"), None)
    print(f"memory limit {limit / 2**20:.2f} MiB/device: {len(flagged)} candidates flagged before running, "
          f"{len(overlap)} of them run (must be 0)"
          + (f"; e.g. {example.candidate.key}: {example.reason}" if example else ""))
    good = ratio >= 0.95 and len(looked) <= len(rows) / 3 + 1e-9 and not overlap
    print("RESULT:", "PASS" if good else "FAIL")
    return 0 if good else 1


def _timed_tune(tree: str) -> tuple[float, str, tuple[float, float]]:
    """Wall seconds of the default `tputool tune --model llama --cpu-devices 8` with `tree` first on the path,
    the output's "ran/predicted" line, and the 1-minute load average before and after."""
    import re
    import subprocess
    import tempfile

    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env["PYTHONPATH"] = tree
    with tempfile.TemporaryDirectory() as tmp:
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "tputool", "tune", "--model", "llama", "--cpu-devices", "8",
                            "--out", os.path.join(tmp, "t.yaml")], cwd=tmp, env=env, capture_output=True, text=True)
        secs = time.perf_counter() - t0
    out = " ".join(p.stdout.split())
    ran = re.search(r"(ran \d+ of \d+ candidates[^;]*|predicted \d+ candidates[^;]*; ran \d+ of them)", out)
    what = ran.group(0) if ran else f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}"
    return secs, what, (load0, os.getloadavg()[0])


def wall(base: str, rounds: int) -> int:
    """Interleave `rounds` timed default runs of BASE (a temporary worktree) and this checkout."""
    import subprocess
    import tempfile

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "base")
        subprocess.run(["git", "-C", root, "worktree", "add", "--detach", tree, base], check=True,
                       capture_output=True)
        try:
            times: dict[str, list[float]] = {"base": [], "this": []}
            for i in range(rounds):
                for name, where in (("base", tree), ("this", root)):
                    secs, what, (l0, l1) = _timed_tune(where)
                    times[name].append(secs)
                    print(f"round {i + 1} {name:4s} ({base if name == 'base' else 'this checkout'}): {secs:6.1f} s; "
                          f"{what}; load avg {l0:.2f} -> {l1:.2f}", flush=True)
        finally:
            subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], capture_output=True)
    b, t = min(times["base"]), min(times["this"])
    print(f"default tune --model llama --cpu-devices 8: best {b:.1f} s before, {t:.1f} s after = "
          f"{b / t:.2f}x faster ({os.cpu_count()} cores on this machine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
