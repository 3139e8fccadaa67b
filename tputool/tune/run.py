"""`tputool run --config tputool-tune.yaml train.py`: run a script with the tuned configuration active."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from tputool.errors import UserError
from tputool.tune.config import TuneConfig, apply_config


def run_script(script: str | Path, args: list[str], config: str | Path) -> TuneConfig:
    """Apply `config`, then run `script` as __main__ with `args`; returns the applied config."""
    path = Path(script)
    if not path.is_file():
        raise UserError(f"script not found: {script}")
    cfg = apply_config(config)
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise UserError(f"{script} exited with status {e.code}") from e
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
    return cfg
