"""Check diagnose's first advice on real training scripts: apply it and measure the saving it predicted.

Usage: python benchmarks/advice_check.py DIR:SCRIPT[:ARGS] [...] [--steps N] [--rounds R] [--unsafe-fixes]
                                         [--stand-in-tensorboard]

Each DIR is an extracted training repository of the development set (nothing of theirs is committed here), e.g.
  git --git-dir /work/.mirror/karpathy+makemore/repo archive HEAD | tar -x -C /tmp/makemore
  python benchmarks/advice_check.py --stand-in-tensorboard \
      "/tmp/makemore:makemore.py:-i names.txt --device tpu -n 0 --n-layer 2 --n-embd 32 --n-embd2 32 -b 16"
SCRIPT is the entry point inside DIR (run from DIR, with DIR on the import path); ARGS (space-separated) are passed
to it. For each one the benchmark copies DIR to a temporary directory, runs `tputool port --write` there, runs
`tputool diagnose --format json --max-steps N` on the ported script and takes the first advice (the first problem
of the verdict; with none, the TPU813 note that compiling gains nothing) and its predicted saving (`cost_ms_per_step`). Then it applies the
advice, where it has an edit for it:

  TPU813  (run the step under torch.compile) as the advice's fix says: right after the statement that builds the
          compiled model class (`NAME = Cls(...)`, looked up in the finding's file, then in SCRIPT), it inserts
          `NAME = torch.compile(NAME, backend="tpu")` into the ported copy.

and times the optimizer steps of the ported script before and after the edit, interleaved (A B A B ...), each run
stopped after N optimizer steps; a run's step time is the median interval over its second half. Findings of other
kinds have no edit here: they are listed with their predicted cost, "not applied".
--stand-in-tensorboard gives the scripts a no-op `torch.utils.tensorboard.SummaryWriter` (tensorboard is not
installed here; makemore logs to it), the same on both sides.
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

from tputool.diagnose.cost import COMPILE_NOTE_FRACTION as NO_GAIN_FRACTION

_CLI = [sys.executable, "-m", "tputool"]

# Runs SCRIPT with its argv, timing every optimizer step (the device synchronised first) and stopping after N.
_TIMER = """
import json, os, runpy, sys, time, torch, torch.optim.optimizer as oo
import tputool.backend  # noqa: F401  (the tpu device)
n, out, script = int(sys.argv[1]), sys.argv[2], sys.argv[3]
times = []
def _hook(opt, args, kwargs):
    torch.tpu.synchronize()
    times.append(time.perf_counter())
    if len(times) >= n:
        with open(out, "w") as f:
            json.dump(times, f)
        sys.stdout.flush()
        os._exit(0)
oo.register_optimizer_step_post_hook(_hook)
sys.argv = [script] + sys.argv[4:]
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
with open(out, "w") as f:
    json.dump(times, f)
"""

# A no-op torch.utils.tensorboard, provided on import through sitecustomize (--stand-in-tensorboard).
_TENSORBOARD_STAND_IN = """
import importlib.abc, importlib.machinery, sys, types
class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name == "torch.utils.tensorboard" else None
    def create_module(self, spec):
        class SummaryWriter:
            def __init__(self, *args, **kwargs): pass
            def __getattr__(self, name): return lambda *args, **kwargs: None
        mod = types.ModuleType(spec.name)
        mod.SummaryWriter = SummaryWriter
        return mod
    def exec_module(self, module): pass
sys.meta_path.insert(0, _StandIn())
"""

_EXTRA_PATH: list[str] = []  # directories put on PYTHONPATH for every run (the stand-in)


def _run(*cmd: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    path = [str(Path(__file__).resolve().parents[1]), *_EXTRA_PATH, str(cwd), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    return subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def diagnose(workdir: Path, script: str, args: list[str], steps: int) -> dict:
    """The JSON report of `tputool diagnose` on the ported script."""
    p = _run(*_CLI, "diagnose", script, "--format", "json", "--max-steps", str(steps), "--fail-on", "error",
             "--", *args, cwd=workdir)
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:
        sys.exit(f"advice_check: diagnose gave no JSON for {script} (exit {p.returncode}): {p.stderr[-400:]}")


def first_advice(doc: dict) -> dict | None:
    """The verdict's first problem (a runtime warning or error); with none, the compiled-step note (TPU813 "no
    gain measured"), whose claim is checked the same way; None when there is neither."""
    runtime = [f for f in doc.get("findings", []) if f["source"] == "runtime" and f["code"] not in ("TPU810", "TPU811")]
    problems = [f for f in runtime if f["severity"] in ("warning", "error")]
    return (problems or [f for f in runtime if f["code"] == "TPU813"] or [None])[0]


def _builds(tree: ast.AST, classes: set[str]) -> list[ast.Assign]:
    """Statements `NAME = Cls(...)` (or `NAME = pkg.Cls(...)`) for a class in CLASSES."""
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call)):
            func = node.value.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name in classes:
                out.append(node)
    return out


def apply_compile(files: list[Path], classes: set[str]) -> tuple[Path, int] | None:
    """Insert `NAME = torch.compile(NAME, backend="tpu")` after the one statement building a model of CLASSES,
    in the first of FILES that has exactly one; returns (file, line of the build) or None when none has."""
    for path in files:
        source = path.read_text()
        found = _builds(ast.parse(source), classes)
        if len(found) != 1:
            continue
        node = found[0]
        lines = source.splitlines(keepends=True)
        indent = lines[node.lineno - 1][: node.col_offset]
        name = node.targets[0].id
        lines.insert(node.end_lineno, f'{indent}{name} = torch.compile({name}, backend="tpu")  # advice_check\n')
        path.write_text("".join(lines))
        return path, node.lineno
    return None


def step_ms(workdir: Path, script: str, args: list[str], steps: int) -> float:
    """Median optimizer-step interval (ms) over the second half of a run stopped after STEPS steps."""
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    p = _run(sys.executable, "-c", _TIMER, str(steps), out, script, *args, cwd=workdir)
    text = Path(out).read_text()
    os.unlink(out)
    times = json.loads(text) if text else []
    if len(times) < 4:
        sys.exit(f"advice_check: {script} made {len(times)} steps (exit {p.returncode}): {p.stderr[-400:]}")
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    return 1000 * statistics.median(gaps[len(gaps) // 2:])


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def check(spec: str, steps: int, rounds: int, unsafe: bool) -> None:
    """Port, diagnose, apply the first advice and print predicted vs measured saving for one DIR:SCRIPT[:ARGS]."""
    src_dir, script, *rest = spec.split(":", 2)
    args = shlex.split(rest[0]) if rest else []
    name = f"{Path(src_dir).name}/{script}"
    with tempfile.TemporaryDirectory() as tmp:
        before, after = Path(tmp) / "before", Path(tmp) / "after"
        shutil.copytree(src_dir, before)
        p = _run(*_CLI, "port", "--write", *(["--unsafe-fixes"] if unsafe else []), ".", cwd=before)
        if p.returncode not in (0, 1):
            sys.exit(f"advice_check: port failed on {src_dir}: {p.stderr[-400:]}")
        doc = diagnose(before, script, args, steps)
        advice = first_advice(doc)
        print(f"{name}  ({doc['steps']} steps diagnosed, {_ms((doc['step_s'] or 0) * 1000)} ms/step under diagnose)")
        print(f"  verdict: {doc['verdict']}")
        if advice is None:
            print("  no advice")
            return
        others = [f for f in doc["findings"] if f is not advice and f.get("cost_ms_per_step") is not None]
        print(f"  first advice: {advice['code']} ({advice['severity']}) at {advice['file']}:{advice['line']}: "
              f"{advice['message']}")
        print(f"    fix: {advice['fix']}")
        for f in others:
            print(f"  other costed finding: {f['code']} at {f['file']}:{f['line']}: {_ms(f['cost_ms_per_step'])} "
                  f"ms/step ({f['cost_basis']}), not applied (no edit for {f['code']})")
        if advice["code"] != "TPU813":
            print(f"  predicted saving {_ms(advice.get('cost_ms_per_step'))} ms/step ({advice.get('cost_basis')}); "
                  "not applied (no edit for it)")
            return
        shutil.copytree(before, after)
        classes = {c.strip() for c in advice["extra"]["models"].split(",")}
        files = list(dict.fromkeys([after / advice["file"], after / script]))
        edited = apply_compile([f for f in files if f.is_file()], classes)
        if edited is None:
            print(f"  not applied: no single `NAME = {'|'.join(sorted(classes))}(...)` in {advice['file']} or {script}")
            return
        print(f"  applied: torch.compile after {edited[0].relative_to(after)}:{edited[1]}")
        a, b = [], []
        for _ in range(rounds):
            a.append(step_ms(before, script, args, steps))
            b.append(step_ms(after, script, args, steps))
        ma, mb = statistics.median(a), statistics.median(b)
        paired = [x - y for x, y in zip(a, b, strict=True)]  # each round's saving
        noise = statistics.median(abs(d - statistics.median(paired)) for d in paired)
        eager, comp = advice["extra"]["eager_ms"], advice["extra"]["compiled_ms"]
        pred = eager - comp
        print(f"  predicted: {_ms(eager)} -> {_ms(comp)} ms/step, saving {_ms(pred)} ms ({pred / eager:.0%}); "
              f"ranked cost {_ms(advice['cost_ms_per_step'])} ms/step ({advice['cost_basis']})")
        print(f"  measured:  {_ms(ma)} -> {_ms(mb)} ms/step, saving {_ms(ma - mb)} ms ({(ma - mb) / ma:.0%}); "
              f"median of {rounds} interleaved rounds of {steps} steps: before {[round(x, 1) for x in a]}, "
              f"after {[round(x, 1) for x in b]}; round-to-round spread of the saving +-{_ms(noise)} ms")
        if advice["severity"] == "info":  # the note that compiling gains nothing: does the measurement agree?
            gain = (ma - mb) / ma
            agrees = gain < NO_GAIN_FRACTION or ma - mb - noise < NO_GAIN_FRACTION * ma
            print(f"  no-gain note {'confirmed' if agrees else 'contradicted'}: measured saving {gain:.0%} of the step, "
                  f"+-{noise / ma:.0%} between rounds (the note's threshold: {NO_GAIN_FRACTION:.0%})")
            return
        above = [f["code"] for f in others if (f.get("cost_ms_per_step") or 0) >= ma - mb]
        print("  largest saving: " + (f"no, {', '.join(above)} predicted to cost more than this measured saving"
                                      if above else "yes (the only finding with an edit here; every other finding's "
                                      "predicted cost is below this measured saving)"))


def main() -> None:
    """Parse the command line and check each script."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", metavar="DIR:SCRIPT[:ARGS]")
    ap.add_argument("--steps", type=int, default=16, help="optimizer steps per run (default 16)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved before/after rounds (default 3)")
    ap.add_argument("--unsafe-fixes", action="store_true", help="port with --unsafe-fixes (bare device integers)")
    ap.add_argument("--stand-in-tensorboard", action="store_true",
                    help="a no-op torch.utils.tensorboard.SummaryWriter for the scripts (same on both sides)")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as stand_in:
        if ns.stand_in_tensorboard:
            Path(stand_in, "sitecustomize.py").write_text(_TENSORBOARD_STAND_IN)
            _EXTRA_PATH.append(stand_in)
        print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
        for spec in ns.specs:
            check(spec, ns.steps, ns.rounds, ns.unsafe_fixes)
        print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
