"""Check diagnose's first advice on real training scripts: apply it and measure the saving it predicted.

Usage: python benchmarks/advice_check.py DIR:SCRIPT[:ARGS] [...] [--steps N] [--rounds R]

Each DIR is an extracted training repository of the development set (nothing of theirs is committed here), e.g.
  git --git-dir /work/.mirror/karpathy+makemore/repo archive HEAD | tar -x -C /tmp/makemore
  python benchmarks/advice_check.py "/tmp/makemore:makemore.py:-i names.txt -o out --max-steps 40 --device tpu"
SCRIPT is the entry point inside DIR; ARGS (space-separated) are passed to it. For each one the script copies DIR
to a temporary directory, runs `tputool port --write` there, runs `tputool diagnose --format json` on the ported
script and takes the FIRST finding and its predicted saving (`cost_ms_per_step`). It then applies the advice:

  TPU813  (run the step under torch.compile) the model called at the finding's line is wrapped once, before the
          loop holding that call, in `NAME = torch.compile(NAME, backend="tpu")` (a source edit of the ported copy)

and times the optimizer steps of the ported script before and after, interleaved (A B A B ...), each run stopped
after --steps optimizer steps; the step time is the median interval over the second half of the steps. A first
advice of another kind is printed with its prediction and marked "not applied" (this script has no edit for it).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_CLI = [sys.executable, "-m", "tputool"]

# Runs SCRIPT with its argv, timing every optimizer step (the device synchronised first) and stopping after N.
_TIMER = """
import os, runpy, sys, time, json, torch, torch.optim.optimizer as oo
import tputool.backend  # noqa: F401  (the tpu device)
n, out, script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
times = []
def _hook(opt, args, kwargs):
    torch.tpu.synchronize()
    times.append(time.perf_counter())
    if len(times) >= n:
        Path = __import__("pathlib").Path
        Path(out).write_text(json.dumps(times))
        os._exit(0)
oo.register_optimizer_step_post_hook(_hook)
sys.argv = [script] + sys.argv[4:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
__import__("pathlib").Path(out).write_text(json.dumps(times))
"""


def _run(*cmd: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def first_advice(workdir: Path, script: str, args: list[str], steps: int) -> dict | None:
    """The first finding of `tputool diagnose --format json` on the ported script (None when it has none)."""
    p = _run(*_CLI, "diagnose", script, "--format", "json", "--max-steps", str(steps), "--fail-on", "error",
             "--", *args, cwd=workdir)
    try:
        doc = json.loads(p.stdout)
    except json.JSONDecodeError:
        sys.exit(f"advice_check: diagnose gave no JSON for {script} (exit {p.returncode}): {p.stderr[-400:]}")
    findings = [f for f in doc.get("findings", []) if f.get("severity") != "info" or f.get("cost_ms_per_step")]
    return findings[0] if findings else None


def apply_compile(source: str, line: int) -> str | None:
    """The source with the model called at LINE compiled once before the outermost loop holding that call."""
    tree = ast.parse(source)
    name = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.lineno == line and isinstance(node.func, ast.Name):
            name = node.func.id
            break
    if name is None:
        return None

    def outer_loop(body: list[ast.stmt]) -> ast.stmt | None:
        for stmt in body:
            if getattr(stmt, "lineno", 0) <= line <= getattr(stmt, "end_lineno", 0):
                if isinstance(stmt, (ast.For, ast.While)):
                    return stmt
                for field in ("body", "orelse", "finalbody"):
                    inner = outer_loop(getattr(stmt, field, []) or [])
                    if inner is not None:
                        return inner
        return None

    loop = outer_loop(tree.body)
    if loop is None:
        return None
    lines = source.splitlines(keepends=True)
    indent = lines[loop.lineno - 1][: loop.col_offset]
    lines.insert(loop.lineno - 1, f'{indent}{name} = torch.compile({name}, backend="tpu")  # advice_check\n')
    return "".join(lines)


def step_ms(workdir: Path, script: str, args: list[str], steps: int) -> float:
    """Median optimizer-step interval (ms) over the second half of a run stopped after STEPS steps."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    p = _run(sys.executable, "-c", _TIMER, str(steps), out, script, *args, cwd=workdir)
    times = json.loads(Path(out).read_text() or "[]") if Path(out).stat().st_size else []
    os.unlink(out)
    if len(times) < 4:
        sys.exit(f"advice_check: {script} made {len(times)} steps (exit {p.returncode}): {p.stderr[-400:]}")
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return 1000 * statistics.median(gaps[len(gaps) // 2:])


def check(spec: str, steps: int, rounds: int) -> None:
    """Port, diagnose, apply the first advice and print predicted vs measured saving for one DIR:SCRIPT[:ARGS]."""
    src_dir, script, *rest = spec.split(":", 2)
    args = shlex.split(rest[0]) if rest else []
    with tempfile.TemporaryDirectory() as tmp:
        before, after = Path(tmp) / "before", Path(tmp) / "after"
        shutil.copytree(src_dir, before)
        p = _run(*_CLI, "port", "--write", ".", cwd=before)
        if p.returncode not in (0, 1):
            sys.exit(f"advice_check: port failed on {src_dir}: {p.stderr[-400:]}")
        advice = first_advice(before, script, args, steps)
        name = f"{Path(src_dir).name}/{script}"
        if advice is None:
            print(f"{name}: no advice")
            return
        predicted = advice.get("cost_ms_per_step")
        head = f"{name}: first advice {advice['code']} at line {advice['line']}: {advice['message']}"
        print(head)
        if advice["code"] != "TPU813":
            print(f"  predicted saving {predicted} ms/step ({advice.get('cost_basis')}); not applied (no edit)")
            return
        shutil.copytree(before, after)
        target = after / script
        edited = apply_compile(target.read_text(), int(advice["line"]))
        if edited is None:
            print("  not applied: no loop around a plain model call at that line")
            return
        target.write_text(edited)
        a, b = [], []
        for _ in range(rounds):
            a.append(step_ms(before, script, args, steps))
            b.append(step_ms(after, script, args, steps))
        ma, mb = statistics.median(a), statistics.median(b)
        print(f"  predicted: {advice['extra']['eager_ms']:.1f} -> {advice['extra']['compiled_ms']:.1f} ms/step "
              f"(saving {predicted:.1f} ms, {advice.get('cost_basis')})")
        print(f"  measured:  {ma:.1f} -> {mb:.1f} ms/step (saving {ma - mb:.1f} ms; {rounds} interleaved rounds "
              f"of {steps} steps; before {[round(x, 1) for x in a]}, after {[round(x, 1) for x in b]})")


def main() -> None:
    """Parse the command line and check each script."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", metavar="DIR:SCRIPT[:ARGS]")
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps per run (default 12)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved before/after rounds (default 3)")
    ns = ap.parse_args()
    print(f"load average: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)")
    for spec in ns.specs:
        check(spec, ns.steps, ns.rounds)


if __name__ == "__main__":
    main()
