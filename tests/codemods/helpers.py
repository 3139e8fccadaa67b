"""Small helpers shared by the engine/CLI tests."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from tputool.cli import app

runner = CliRunner()


def invoke(*args: str, cwd: Path | None = None):
    """Run `tputool ARGS...` in-process (optionally from `cwd`) and return Click's Result."""
    import os

    old = os.getcwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        return runner.invoke(app, list(args), catch_exceptions=False)
    finally:
        os.chdir(old)


def write(root: Path, rel: str, text: str | bytes) -> Path:
    """Create file `root/rel` (parents too) with `text` (bytes written as-is)."""
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_bytes(text.encode("utf-8"))
    return p


TRAIN = 'import torch\n\nmodel = torch.nn.Linear(2, 2).cuda()\nx = torch.ones(2).cuda()\n'
