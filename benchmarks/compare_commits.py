"""Run one benchmark on two commits side by side, interleaved: BASE, HEAD, BASE, HEAD, ...

The base commit is checked out into a temporary git worktree; each round runs the benchmark script once with
the base tree first on PYTHONPATH, then once with this checkout's tree (same interpreter, same machine
conditions), so a change of the machine's load hits both alike. Prints every run's output, labelled, and the
lines matching --grep side by side at the end.

    python benchmarks/compare_commits.py BASE_REV [--rounds 3] [--grep 'fused vs strict'] -- SCRIPT [ARGS...]

SCRIPT is a path relative to the repository root (e.g. benchmarks/train_step.py); each tree runs its own copy.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_in(tree: Path, script: list[str]) -> str:
    """Run `script` from `tree` with `tree` first on PYTHONPATH; its combined output."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(tree / script[0]), *script[1:]]
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    out = p.stdout + (f"\n[exit {p.returncode}]\n{p.stderr[-2000:]}" if p.returncode else "")
    return out


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the interleaved rounds, print the outputs and the matching lines."""
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: compare_commits.py BASE_REV [--rounds N] [--grep REGEX] -- SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    i = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--grep", default=None, help="regex of the lines to gather at the end")
    args = ap.parse_args(argv[:i])
    script = argv[i + 1:]
    with tempfile.TemporaryDirectory(prefix="tputool-base-") as tmp:
        base = Path(tmp) / "base"
        r = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), args.base],
                           capture_output=True, text=True)
        if r.returncode:
            print(f"compare_commits: cannot check out {args.base!r}: {r.stderr.strip().splitlines()[-1]}",
                  file=sys.stderr)
            return 2
        try:
            gathered: dict[str, list[str]] = {"base": [], "head": []}
            for k in range(args.rounds):
                for label, tree in (("base", base), ("head", ROOT)):
                    out = run_in(tree, script)
                    print(f"===== round {k + 1} {label} =====\n{out}", flush=True)
                    if args.grep:
                        gathered[label] += [ln for ln in out.splitlines() if re.search(args.grep, ln)]
            if args.grep:
                for label, lines in gathered.items():
                    print(f"== {label} ({args.base if label == 'base' else 'HEAD'})")
                    print("\n".join(lines))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
