"""The command outputs the docs show, produced by real runs so they cannot drift.

`python -m tputool.docs_examples` rewrites `docs/examples/<name>.txt` from fresh runs on the bundled
fixtures; `tests/test_docs_examples.py` fails when a committed file differs from a fresh run. Pages include
the files with `--8<-- "docs/examples/<name>.txt"`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "docs" / "examples"

# name -> the tputool arguments it runs, from the repository root (deterministic commands only).
EXAMPLES: dict[str, list[str]] = {
    "check-github": ["check", "fixtures/sample_repo", "--format", "github"],
    "check-statistics": ["check", "fixtures/sample_repo", "--statistics"],
    "port-sample": ["port", "fixtures/sample_repo"],
}


def render(name: str) -> str:
    """Run example `name` and return what the docs show: the command line, then its output."""
    args = EXAMPLES[name]
    env = {**os.environ, "COLUMNS": "110", "NO_COLOR": "1", "TERM": "dumb"}
    proc = subprocess.run([sys.executable, "-m", "tputool", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"tputool {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    body = "\n".join(line.rstrip() for line in proc.stdout.rstrip().splitlines())
    return f"$ tputool {' '.join(args)}\n{body}\n"


def main() -> None:
    """Write every example's fresh output under docs/examples/."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name in EXAMPLES:
        (OUT_DIR / f"{name}.txt").write_text(render(name), encoding="utf-8")
        print(f"wrote docs/examples/{name}.txt")


if __name__ == "__main__":
    main()
