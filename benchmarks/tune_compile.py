"""How fast does a candidate compile for a real TPU topology, and does the cost model's memory verdict agree
with the TPU compiler's? (compile-only devices: needs the `tpu-compile` extra, the libtpu wheel; no TPU)

1. Compile time of one training step of a Llama 3 8B (32 layers, seq 4096) for a v5e topology with the
   layers as one `jax.lax.scan` body, and unrolled at a few smaller layer counts (unrolled grows with the
   depth, scan does not).
2. Over a set of candidates (mesh, batch, remat, attention), the cost model's fits / does-not-fit verdict
   against the TPU compiler's (its memory_analysis against the chip's HBM, or its out-of-memory error):
   the agreement rate, and the compiled memory beside the predicted.

    PYTHONPATH=.:/path/to/libtpu-site python benchmarks/tune_compile.py [--topology v5e:4x4] [--verdicts 8]
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

warnings.filterwarnings("ignore")

LLAMA3_8B = {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "ffn_dim": 14336, "max_seq_len": 4096,
             "vocab_size": 128256, "tie_embeddings": False}
GIB = 2 ** 30


def compile_seconds(rm, c, devices, scan: bool, log) -> tuple[float, float, float]:
    """(seconds to export, build and lower one step; seconds XLA compiles it; compiled bytes/device)."""
    from tputool.backend.graph.attention_kernels import for_tpu_target
    from tputool.tune.step import build_step
    from tputool.tune.tpu_compile import compiled_bytes

    t0 = time.perf_counter()
    with log.capture(c.key), for_tpu_target():
        lowered = build_step(rm.spec, rm.config, c, devices=devices, materialize=False, scan_layers=scan).lower()
        t1 = time.perf_counter()
        compiled = lowered.compile()
    return t1 - t0, time.perf_counter() - t1, compiled_bytes(compiled)


def verdicts(rm, hw, devices, candidates, log) -> list[tuple]:
    """Per candidate: (key, predicted bytes, predicted fits, compiled bytes or None, compiler fits, note)."""
    from tputool.partition import partition_specs
    from tputool.tune.cost_model import estimate

    out = []
    for c in candidates:
        local = partition_specs(rm.param_shapes, c.mesh).local_elements(rm.param_shapes, c.mesh)
        e = estimate(rm.dims, c, hw, params_per_device=local)
        try:
            build_s, xla_s, got = compile_seconds(rm, c, devices, True, log)
            fits, note = got <= hw.hbm_bytes, f"build+lower {build_s:.0f} s, XLA {xla_s:.0f} s"
        except Exception as err:  # noqa: BLE001 - an out-of-memory compile is a verdict, not a failure
            text = str(err)
            if "RESOURCE_EXHAUSTED" not in text and "memory" not in text.lower():
                raise
            got, fits, note = None, False, "compiler: out of memory"
        out.append((c.key, e.memory.total, e.fits, got, fits, note))
        print(f"  {c.key:38s} predicted {e.memory.total / GIB:7.2f} GiB {'fits' if e.fits else 'OOM ':4s} | "
              f"compiled {'-' if got is None else f'{got / GIB:7.2f} GiB'} {'fits' if fits else 'OOM '} "
              f"({note})", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", default="v5e:4x4")
    ap.add_argument("--unrolled-layers", default="4,8", help="layer counts compiled unrolled and scanned")
    ap.add_argument("--verdicts", type=int, default=8, help="candidates whose memory verdicts are compared")
    args = ap.parse_args()

    from tputool.tune import tpu_compile
    from tputool.tune.api import resolve_model
    from tputool.tune.candidate import Candidate
    from tputool.tune.hardware import tpu_hardware
    from tputool.tune.xla_log import XlaLog

    if not tpu_compile.available():
        print("libtpu is not importable: install the tpu-compile extra (pip install 'tputool[tpu-compile]')")
        return 2
    hw = tpu_hardware(args.topology)
    devices = tpu_compile.topology_devices(hw.slice.topology_name)
    n = len(devices)
    log = XlaLog()
    print(f"Llama 3 8B, seq {LLAMA3_8B['max_seq_len']}, compiled for {hw.slice.topology_name} ({n} chips, "
          f"{hw.hbm_bytes / GIB:.1f} GiB HBM each), compile-only devices")
    base = Candidate(fsdp=n, batch=1, remat="full", attention="splash", block=512)
    print(f"\n1. compile time, candidate {base.key}")
    rm32 = resolve_model("llama", LLAMA3_8B)
    b_s, x_s, b32 = compile_seconds(rm32, base, devices, True, log)
    print(f"  32 layers, scan     : build+lower {b_s:6.1f} s, XLA compile {x_s:6.1f} s  "
          f"({b32 / GIB:.2f} GiB/device)", flush=True)
    for layers in (int(x) for x in args.unrolled_layers.split(",")):
        rm = resolve_model("llama", {**LLAMA3_8B, "n_layers": layers})
        for scan in (False, True):
            b_s, x_s, _ = compile_seconds(rm, base, devices, scan, log)
            print(f"  {layers:2d} layers, {'scan    ' if scan else 'unrolled'}: build+lower {b_s:6.1f} s, "
                  f"XLA compile {x_s:6.1f} s", flush=True)

    print("\n2. memory verdict: cost model vs TPU compiler (scan over layers)")
    cands = [Candidate(fsdp=n, batch=1, remat="full", attention="splash", block=512),
             Candidate(fsdp=n, batch=1, remat="full", attention="chunked", block=512),
             Candidate(fsdp=n, batch=1, remat="full"),
             Candidate(fsdp=n // 2, tensor=2, batch=1, remat="full", attention="flash", block=512),
             Candidate(fsdp=n, batch=2, remat="full", attention="splash", block=512),
             Candidate(fsdp=n // 4, tensor=4, batch=1, remat="full", attention="splash", block=512),
             Candidate(fsdp=n, batch=4, remat="none"),
             Candidate(data=n, batch=1, remat="full")][: args.verdicts]
    rows = verdicts(rm32, hw, devices, cands, log)
    agree = sum(r[2] == r[4] for r in rows)
    print(f"memory verdict agreement: {agree}/{len(rows)} = {100 * agree / len(rows):.0f}%")
    both = [(r[1], r[3]) for r in rows if r[3]]
    if both:
        ratios = sorted(p / g for p, g in both)
        print(f"predicted / compiled bytes: median {ratios[len(ratios) // 2]:.2f} "
              f"(min {ratios[0]:.2f}, max {ratios[-1]:.2f}) over {len(both)} compiled candidates")
    for line in log.summary():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
