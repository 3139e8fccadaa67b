"""`tputool run --config tputool-tune.yaml train.py`: run a script with the tuned configuration active."""

from __future__ import annotations

from pathlib import Path

from tputool.scripts import run_as_main, script_path
from tputool.tune.config import TuneConfig, apply_config


def run_script(script: str | Path, args: list[str], config: str | Path) -> TuneConfig:
    """Apply `config`, then run `script` as __main__ with `args`; returns the applied config."""
    path = script_path(script)
    cfg = apply_config(config)
    run_as_main(path, args)
    return cfg
