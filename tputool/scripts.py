"""Running a user's script as `__main__` in this process (for `tputool run` and `tputool profile`)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

from tputool.errors import UserError


def script_path(script: str | Path) -> Path:
    """`script` as a Path; a missing file is a UserError."""
    path = Path(script)
    if not path.is_file():
        raise UserError(f"script not found: {script}")
    return path


def run_as_main(path: Path, args: list[str]) -> None:
    """Run `path` as __main__ with sys.argv = [path, *args] and its folder on sys.path (both restored after).

    A non-zero `sys.exit` from the script becomes a UserError.
    """
    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent.resolve()))
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        if e.code not in (0, None):
            raise UserError(f"{path} exited with status {e.code}") from e
    finally:
        sys.argv, sys.path[:] = old_argv, old_path
