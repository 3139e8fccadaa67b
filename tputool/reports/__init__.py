"""HTML reports with plots for `diagnose --html`, `parity --html` and `tune --html`: one self-contained file
each (inline SVG from matplotlib, inline CSS, no scripts, nothing fetched).

`html.py` is the page shell, `plots.py` the matplotlib set-up shared by the plots, and one module per tool
renders its report from the data its text/JSON report uses. matplotlib is an optional extra
(`pip install 'tputool[report]'`): `prepare(path)` checks it and the output path before a run starts.
"""

from __future__ import annotations

import os

from tputool.errors import UserError

INSTALL_HINT = "--html needs matplotlib: pip install 'tputool[report]' (or pip install matplotlib)"


def prepare(path: str) -> str:
    """Check, before any run, that matplotlib is installed and `path` can be written; returns its absolute path."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise UserError(f"--html {path} is a directory; give a file name")
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise UserError(f"--html {path}: no such directory {directory}")
    if not os.access(directory, os.W_OK | os.X_OK) or (os.path.exists(target) and not os.access(target, os.W_OK)):
        raise UserError(f"--html {path}: not writable")
    return target


def write(path: str, text: str) -> str:
    """Write the page at `path` atomically (a temp file beside it, then a rename); returns the path."""
    from tputool.codemods.writer import write_atomic

    write_atomic(path, text.encode("utf-8"))
    return path
