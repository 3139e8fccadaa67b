"""How fast is `tputool port` compared with the floor: libcst parse + codegen of the same files?

Builds two trees of real Python modules (copied from the installed torch package) in a temp directory:
  sparse: few files mention CUDA (about 5%), as in most real repositories;
  heavy:  every file mentions CUDA (a CUDA training snippet appended to each module).
Then, side by side in one run, times
  floor-1   read + `libcst.parse_module(src).code` for every file, one process;
  floor-N   the same over N worker processes (same chunking, same fork pool);
  port-1    tputool's engine.run (the code path of `tputool port`, diffs on, nothing written), jobs=1;
  port-N    the same with jobs=N;
and prints the ratios port/floor. Targets: heavy port-N <= 1.3x floor-N; sparse well under 1x.

With --memory SIZES (MB, e.g. 1,3,5): three files per size,
  modules  the same torch modules with the CUDA snippet after each (most statements cold),
  hot      copies of the snippet (every statement hot),
  scoped   hot copies that also take a `device` argument next to `from torch import device` (the name index is
           inexact: port resolves names with libcst's scope analysis),
and the peak resident memory and time of a fresh process that
  base     ports a tiny file (the same imports and rules loaded: what any port costs),
  parse    only parses the file with libcst (libcst's tree of the whole file),
  port     runs `tputool port`'s analysis of it (engine.run_source: decode, port_python, the unified diff; a file
           over WINDOW_CHARS is rewritten a window of module-level statements at a time),
  whole    the same with windows off (libcst's tree of the whole file at once, as before windows; only for
           sizes up to --whole-max MB: it needs ~0.5 GB per MB),
printed as MB above `base` per MB of source, interleaved. Files over --max-file-size (default 1 MB) are skipped
by `port` (TPU940); the benchmark lifts that limit.

With --against DIR (another checkout of tputool, e.g. a git worktree of main), the same runs of that tputool are
interleaved with this one's: the `@` rows/columns (its own `base`, `port` and seconds; in the speed mode port-1 of
both, each in a fresh process).

Usage: python benchmarks/port_speed.py [--files 2000] [--jobs N] [--repeat 1] [--memory 1,3,5 [--whole-max 3]]
                                       [--against DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

SNIPPET = '''

import torch as _bench_torch


def _bench_train_step(model, batch, local_rank):
    model = model.cuda()
    batch = batch.to("cuda", non_blocking=True)
    _bench_torch.backends.cudnn.benchmark = True
    with _bench_torch.cuda.amp.autocast():
        loss = model(batch).sum()
    _bench_torch.cuda.synchronize()
    return loss.item(), _bench_torch.device("cuda", local_rank)
'''


def _torch_sources(min_bytes: int, max_bytes: int) -> list[Path]:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        sys.exit("torch is not installed: the benchmark copies its sources as realistic modules")
    root = Path(spec.origin).parent
    out = []
    for p in sorted(root.rglob("*.py")):
        try:
            size = p.stat().st_size
        except OSError:
            continue
        if min_bytes <= size <= max_bytes:
            out.append(p)
    return out


def build_trees(base: Path, n_files: int, seed: int = 0) -> dict[str, Path]:
    """Write the sparse and heavy trees under `base`; returns {name: root}."""
    from tputool.codemods.python import PYTHON_TRIGGERS

    rng = random.Random(seed)
    cands = _torch_sources(1_000, 16_000)
    rng.shuffle(cands)
    clean, cuda = [], []
    for p in cands:
        data = p.read_bytes()
        (cuda if any(t in data for t in PYTHON_TRIGGERS) else clean).append(data)
    if not clean:
        sys.exit("no CUDA-free modules found in torch to build the sparse tree")
    n_cuda = min(len(cuda), max(1, n_files // 20))
    # Cycle through the pool when torch has fewer suitable modules than asked for.
    cycle = lambda pool, n: [pool[i % len(pool)] for i in range(n)]  # noqa: E731
    sparse = cycle(clean, n_files - n_cuda) + cuda[:n_cuda]
    heavy = [d + SNIPPET.encode() for d in cycle(clean + cuda, n_files)]
    trees = {}
    for name, files in (("sparse", sparse), ("heavy", heavy)):
        root = base / name
        for i, data in enumerate(files):
            d = root / f"pkg{i // 100:03d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"mod{i:05d}.py").write_bytes(data)
        trees[name] = root
    return trees


def _floor_chunk(paths: list[str]) -> int:
    import libcst

    n = 0
    for p in paths:
        with open(p, "rb") as f:
            src = f.read().decode("utf-8", errors="replace")
        try:
            n += len(libcst.parse_module(src).code)
        except libcst.ParserSyntaxError:
            pass  # tputool reports these as TPU900; the floor just skips them
    return n


def floor(root: Path, jobs: int) -> float:
    """Seconds to read and libcst round-trip every .py file under root (with `jobs` processes)."""
    import libcst  # noqa: F401  (imported before forking, as the engine does)

    from tputool.codemods.engine import _chunks, _pool_context

    paths = sorted(str(p) for p in root.rglob("*.py"))
    t = time.perf_counter()
    if jobs <= 1:
        _floor_chunk(paths)
    else:
        with ProcessPoolExecutor(jobs, mp_context=_pool_context()) as pool:
            list(pool.map(_floor_chunk, _chunks(paths, jobs)))
    return time.perf_counter() - t


_PORT_SECONDS = """
import sys, time
from pathlib import Path
from tputool.codemods import engine
from tputool.codemods.config import ProjectConfig
root = Path(sys.argv[1])
t = time.perf_counter()
engine.run([str(root)], ProjectConfig(root=root), want_diff=True, jobs=int(sys.argv[2]))
print(time.perf_counter() - t)
"""


def port_seconds(root: Path, jobs: int, against: str | None) -> float:
    """port()'s seconds in a fresh process importing this tputool (or the one at `against`), imports untimed."""
    env, cwd = _env(against)
    run = subprocess.run([sys.executable, "-c", _PORT_SECONDS, str(root), str(jobs)], capture_output=True,
                         text=True, check=True, env=env, cwd=cwd)
    return float(run.stdout.split()[-1])


def port(root: Path, jobs: int) -> tuple[float, int, int]:
    """Seconds for tputool's port analysis of root; also (changed files, prefiltered files)."""
    from tputool.codemods import engine
    from tputool.codemods.config import ProjectConfig

    t = time.perf_counter()
    res = engine.run([str(root)], ProjectConfig(root=root), want_diff=True, jobs=jobs)
    dt = time.perf_counter() - t
    return dt, sum(r.status == engine.CHANGED for r in res.files), sum(r.status == engine.PREFILTERED for r in res.files)


_PEAK = """
import resource, sys
from pathlib import Path
mode, path = sys.argv[1], Path(sys.argv[2])
if mode == "parse":
    import libcst
    libcst.parse_module(path.read_text(encoding="utf-8"))
else:
    import tputool.codemods.python as python
    from tputool.codemods import engine
    from tputool.codemods.config import ProjectConfig
    data = sys.argv[3].encode() if mode == "base" else path.read_bytes()
    if mode == "whole":
        python.WINDOW_CHARS = len(data) + 1
    real = python._port_windows
    def spy(*args):
        result = real(*args)
        print("windowed" if result is not None else "fell-back-whole")
        return result
    python._port_windows = spy
    res = engine.run_source(data, str(path), ProjectConfig(root=path.parent, max_file_size=len(data) + 1))
    assert res.files[0].status == engine.CHANGED, res.files[0].status
try:  # this process's own peak (ru_maxrss keeps the forking parent's across exec on Linux)
    print(int(next(ln for ln in open("/proc/self/status") if ln.startswith("VmHWM:")).split()[1]) * 1024)
except OSError:
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def big_file(base: Path, megabytes: float) -> Path:
    """One valid Python file of about `megabytes` MB: torch modules, each followed by the CUDA snippet.

    A module joins only when its imports stay unambiguous next to the others' (no name both imported and
    defined, none imported with two meanings), as in one real large file: port then resolves names from the
    imports (names.py) and can rewrite the file a window at a time, which is what the benchmark measures.
    """
    import ast

    from tputool.codemods.python.speed.names import IndexBuilder
    from tputool.codemods.python.tables import RELEVANT_ROOTS

    out, n = ["import torch as _bench_torch\n"], 0
    targets: dict[str, str] = {}
    bound: set[str] = set()
    for i, src in enumerate(_torch_sources(20_000, 60_000)):
        text = src.read_text(encoding="utf-8").replace("from __future__ import annotations", "")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        one = IndexBuilder()
        one.add(tree)
        index, names = one.index(RELEVANT_ROOTS), one.bound
        if (not index.exact or one.conflicts or "torch" in names or set(index.targets) & bound
                or names & set(targets) or any(targets.get(k, v) != v for k, v in index.targets.items())):
            continue
        targets.update(index.targets)
        bound |= names
        out += [text, SNIPPET.replace("_bench_train_step", f"_bench_train_step_{i}")]
        n += len(text)
        if n >= megabytes * 1e6:
            break
    path = base / f"big_{megabytes:g}mb.py"
    path.write_text("\n".join(out), encoding="utf-8")
    return path


# The scoped file's extra per copy: a `device` parameter shadows the module's `from torch import device`, so the
# name index is inexact and port resolves names with libcst's scope analysis (as in a real file doing the same).
SCOPED = '''

def _bench_place(x, device):
    return x.to(device)


_bench_default = device("cuda")
'''


def hot_file(base: Path, megabytes: float, scoped: bool = False) -> Path:
    """One file of about `megabytes` MB where every statement is hot: copies of the CUDA snippet (`scoped`: each
    with SCOPED after it, the file importing `device` from torch)."""
    body = SNIPPET.replace("import torch as _bench_torch\n", "") + (SCOPED if scoped else "")
    head = "import torch as _bench_torch\n" + ("from torch import device\n" if scoped else "")
    out, n, i = [head], 0, 0
    while n < megabytes * 1e6:
        out.append(body.replace("_bench_train_step", f"_bench_train_step_{i}")
                   .replace("_bench_place", f"_bench_place_{i}").replace("_bench_default", f"_bench_default_{i}"))
        n += len(out[-1])
        i += 1
    path = base / f"{'scoped' if scoped else 'hot'}_{megabytes:g}mb.py"
    path.write_text("".join(out), encoding="utf-8")
    return path


def _env(against: str | None) -> tuple[dict[str, str], str | None]:
    """The environment and working directory of a fresh process importing this tputool (or the one at `against`)."""
    env = {**os.environ, "TPUTOOL_BACKEND": "0"}
    if against is None:
        return env, None
    return {**env, "PYTHONPATH": against}, against


def peak_bytes(mode: str, path: Path, against: str | None = None) -> tuple[int, str]:
    """Peak RSS of a fresh process that parses (`parse`) or ports (`port`, or `whole`: with no windows) `path`
    (`base`: ports a tiny file instead), and whether port went window by window (`against`: the tputool at
    that directory)."""
    env, cwd = _env(against)
    run = subprocess.run([sys.executable, "-c", _PEAK, mode, str(path), SNIPPET], capture_output=True, text=True,
                         check=True, env=env, cwd=cwd)
    words = run.stdout.split()
    return int(words[-1]), (words[0] if len(words) > 1 else "-")


MEMORY_FILES = {"modules": big_file, "hot": hot_file, "scoped": lambda base, mb: hot_file(base, mb, scoped=True)}


def memory(sizes: list[float], repeat: int, whole_max: float, kinds: list[str], against: str | None = None) -> None:
    """Print the peak memory above a tiny file's port, per MB of source: libcst's parse vs port (by windows) vs
    port whole, one file per size and kind (`against`: also the port of the tputool at that directory)."""
    base = Path(tempfile.mkdtemp(prefix="tputool-bench-mem-"))
    at = ("base@", "port@") if against else ()
    try:
        print(f"{'file':>7} {'MB':>5} {'base':>5} {'parse':>6} {'port':>6} {'whole':>6} {'parse/MB':>8} "
              f"{'port/MB':>8} {'whole/MB':>8} {'port s':>7} {'whole s':>7}  port went"
              + (f"  {'base@':>5} {'port@':>6} {'port@/MB':>8} {'port@ s':>7}" if against else ""))
        print(f"{'':>7} {'':>5} {'(peak MB)':>20} {'':>6} {'(MB above base, per MB of source)':>35}")
        for kind, size in ((k, z) for z in sizes for k in kinds):
            path = MEMORY_FILES[kind](base, size)
            mb = path.stat().st_size / 1e6
            modes = ("base", "parse", "port") + (("whole",) if size <= whole_max else ()) + at
            runs: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
            how = "-"
            for _ in range(repeat):  # interleaved
                for mode in modes:
                    t = time.perf_counter()
                    peak, went = peak_bytes(mode.rstrip("@"), path, against if mode.endswith("@") else None)
                    runs[mode].append((peak / 1e6, time.perf_counter() - t))
                    how = went if mode == "port" else how
            peak = {m: min(r[0] for r in runs[m]) for m in modes}
            secs = {m: min(r[1] for r in runs[m]) for m in modes}
            above = {m: (peak[m] - peak["base@" if m.endswith("@") else "base"]) / mb for m in modes}

            def cell(m: str, value: dict, fmt: str, width: int) -> str:
                return format(value[m], fmt).rjust(width) if m in value else "-".rjust(width)

            print(f"{kind:>7} {mb:5.2f} {peak['base']:5.0f} {peak['parse']:6.0f} {peak['port']:6.0f} "
                  f"{cell('whole', peak, '.0f', 6)} {above['parse']:8.1f} {above['port']:8.1f} "
                  f"{cell('whole', above, '.1f', 8)} {secs['port']:7.1f} {cell('whole', secs, '.1f', 7)}  {how}"
                  + (f"  {peak['base@']:5.0f} {peak['port@']:6.0f} {above['port@']:8.1f} {secs['port@']:7.1f}"
                     if against else ""), flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=1, help="take the best of this many timings")
    ap.add_argument("--trees", default="sparse,heavy")
    ap.add_argument("--memory", help="peak memory per MB of source instead: file sizes in MB, e.g. 1,3,5")
    ap.add_argument("--whole-max", type=float, default=3, help="--memory: port whole only files up to this many MB")
    ap.add_argument("--kinds", default="modules,hot,scoped", help="--memory: which files")
    ap.add_argument("--against", help="also measure the tputool of this checkout (a directory), interleaved")
    args = ap.parse_args()
    against = str(Path(args.against).resolve()) if args.against else None
    if args.memory:
        memory([float(x) for x in args.memory.split(",")], args.repeat, args.whole_max, args.kinds.split(","),
               against)
        return
    os.environ.setdefault("TPUTOOL_BACKEND", "0")
    import libcst  # noqa: F401

    from tputool.codemods import python as _rules  # noqa: F401  (warm imports outside the timings)

    base = Path(tempfile.mkdtemp(prefix="tputool-bench-"))
    try:
        trees = build_trees(base, args.files)
        print(f"{args.files} files per tree, {args.jobs} worker processes, best of {args.repeat}")
        print(f"{'tree':8} {'MB':>6} {'floor-1':>8} {'port-1':>8} {'ratio':>6} {'floor-N':>8} {'port-N':>8} "
              f"{'ratio':>6}  changed/prefiltered" + ("   fresh-1 fresh-1@  ratio" if against else ""))
        for name in args.trees.split(","):
            root = trees[name]
            mb = sum(p.stat().st_size for p in root.rglob("*.py")) / 1e6
            t: dict[str, list[float]] = {"f1": [], "p1": [], "fn": [], "pn": [], "s1": [], "a1": []}
            for _ in range(args.repeat):  # interleaved, so load from other processes hits all alike
                t["f1"].append(floor(root, 1))
                t["p1"].append(port(root, 1)[0])
                t["fn"].append(floor(root, args.jobs))
                dt, changed, skipped = port(root, args.jobs)
                t["pn"].append(dt)
                if against:  # this tputool and the other one, each in a fresh process
                    t["s1"].append(port_seconds(root, 1, None))
                    t["a1"].append(port_seconds(root, 1, against))
            f1, p1, fn, pn = (min(t[k]) for k in ("f1", "p1", "fn", "pn"))
            extra = f"   {min(t['s1']):7.2f} {min(t['a1']):8.2f} {min(t['s1']) / min(t['a1']):6.2f}" if against else ""
            print(f"{name:8} {mb:6.1f} {f1:8.2f} {p1:8.2f} {p1 / f1:6.2f} {fn:8.2f} {pn:8.2f} {pn / fn:6.2f}  "
                  f"{changed}/{skipped}" + extra, flush=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
