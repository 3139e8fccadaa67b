"""Wall time of `tputool parity SCRIPT` against running the script twice plainly (once on cpu, once on tpu).

Interleaved rounds: parity, then the plain pair, so a change of the machine's load hits both alike. The plain
cpu run is a copy of the script with its `device = "tpu"` line set to "cpu". Prints each round and the ratio
of the medians.

    python benchmarks/parity_overhead.py [--rounds 3] [--script tests/parity/fixtures/clean_mlp.py] [--steps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return wall


def main() -> None:
    """Measure and print the overhead."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--script", default=str(ROOT / "tests/parity/fixtures/clean_mlp.py"))
    ap.add_argument("--steps", type=int, default=5, help="steps parity records (the fixture runs 5)")
    ns = ap.parse_args()
    src = Path(ns.script).read_text()
    if 'device = "tpu"' not in src:
        raise SystemExit('the script needs a `device = "tpu"` line')
    with tempfile.TemporaryDirectory() as tmp:
        cpu_copy = Path(tmp) / "cpu_copy.py"
        cpu_copy.write_text(src.replace('device = "tpu"', 'device = "cpu"', 1))
        par, plain = [], []
        for i in range(ns.rounds):
            par.append(_run([sys.executable, "-m", "tputool", "parity", ns.script, "--steps", str(ns.steps)]))
            plain.append(_run([sys.executable, str(cpu_copy)]) + _run([sys.executable, ns.script]))
            print(f"round {i}: parity {par[-1]:.2f}s  plain cpu+tpu {plain[-1]:.2f}s")
    p, q = statistics.median(par), statistics.median(plain)
    print(f"parity {p:.2f}s vs plain twice {q:.2f}s: ratio {p / q:.2f}x")


if __name__ == "__main__":
    main()
