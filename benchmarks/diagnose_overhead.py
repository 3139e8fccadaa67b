"""How much slower a training script runs under `tputool diagnose` than plainly (target: <= 1.5x).

Runs one small training script (an MLP, AdamW, a fixed number of steps, on tpu when the device works, else
CPU) twice side by side: `python script.py` and `python -m tputool diagnose script.py` with the same steps,
REPEAT times each, interleaved (one intra-op thread each), and prints the median wall times and their ratio, plus the ratio of the
training loops alone (the script times its own loop), which leaves out interpreter and torch start-up.

    python benchmarks/diagnose_overhead.py [--steps 200] [--repeat 3] [--cpu]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

SCRIPT = '''
import sys, time
import torch

device = "tpu" if getattr(torch, "tpu", None) is not None and torch.tpu.is_available() else "cpu"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(),
                            torch.nn.Linear(256, 128)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x = torch.randn(32, 128, device=device)
y = torch.randn(32, 128, device=device)
steps = int(sys.argv[1])
t0 = time.perf_counter()
for step in range(steps):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    if step % 50 == 0:
        print("step", step, "loss", round(loss.item(), 4))
print(f"LOOP_S {time.perf_counter() - t0:.6f} device={device}")
'''
_LOOP = re.compile(r"LOOP_S ([0-9.]+) device=(\w+)")


# One intra-op thread for both runs: on a shared, busy machine OpenMP spinning makes timings swing 10x+.
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _plain(script: str, steps: int) -> tuple[float, float, str]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, script, str(steps)], capture_output=True, text=True, check=True, env=ENV)
    wall = time.perf_counter() - t0
    m = _LOOP.search(p.stdout)
    return wall, float(m.group(1)), m.group(2)


def _diagnosed(script: str, steps: int) -> tuple[float, float, dict]:
    cmd = [sys.executable, "-m", "tputool", "diagnose", script, "--format", "json", "--no-static", "--", str(steps)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=True, env=ENV)
    wall = time.perf_counter() - t0
    m = _LOOP.search(p.stderr)  # in json mode the script's own output goes to stderr
    return wall, float(m.group(1)), json.loads(p.stdout)


def main() -> None:
    """Measure plain vs diagnosed runs side by side and print the ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu", action="store_true", help="plain CPU torch (no tpu backend): the worst case, "
                    "where each op is cheapest and the observer's per-op cost shows most")
    ns = ap.parse_args()
    if ns.cpu:
        ENV["TPUTOOL_BACKEND"] = "0"
    with tempfile.TemporaryDirectory() as d:
        script = os.path.join(d, "train.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        plain, diag = [], []
        for _ in range(ns.repeat):
            plain.append(_plain(script, ns.steps))
            diag.append(_diagnosed(script, ns.steps))
    device = plain[0][2]
    pw, pl = statistics.median(r[0] for r in plain), statistics.median(r[1] for r in plain)
    dw, dl = statistics.median(r[0] for r in diag), statistics.median(r[1] for r in diag)
    report = diag[-1][2]
    print(f"diagnose overhead: {ns.steps} AdamW steps of a 3-layer MLP on {device}, median of {ns.repeat} runs")
    print(f"  wall time   plain {pw:6.2f} s   diagnose {dw:6.2f} s   ratio {dw / pw:.2f}x   (target <= 1.5x)")
    print(f"  loop only   plain {pl:6.2f} s   diagnose {dl:6.2f} s   ratio {dl / pl:.2f}x")
    print(f"  start-up + report (wall - loop): plain {pw - pl:.2f} s, diagnose {dw - dl:.2f} s")
    print(f"  diagnose saw {report['steps']} steps; verdict: {report['verdict']}")


if __name__ == "__main__":
    main()
