"""Which stack frames are the user's: files under the script's directory, not installed packages or tputool."""

from __future__ import annotations

import os
import sys
import traceback
from types import FrameType, TracebackType

_TPUTOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_NOT_USER = ("site-packages", "dist-packages", "<")


class UserFrames:
    """Decides whether a code file belongs to the user (lives under `user_dir`); answers are cached."""

    def __init__(self, user_dir: str) -> None:
        self.user_dir = os.path.realpath(user_dir).rstrip(os.sep) + os.sep
        self._cache: dict[str, bool] = {}

    def is_user(self, filename: str) -> bool:
        """True for a file under the user's directory that is neither an installed package nor tputool."""
        hit = self._cache.get(filename)
        if hit is None:
            path = os.path.realpath(filename) if not filename.startswith("<") else filename
            hit = (
                path.startswith(self.user_dir)
                and not any(s in path for s in _NOT_USER)
                and not path.startswith(_TPUTOOL_DIR + os.sep)
            )
            self._cache[filename] = hit
        return hit

    def location(self, depth: int = 1) -> tuple[str, int] | None:
        """The innermost user frame above the caller as (file, line), or None when the stack has none."""
        f: FrameType | None = sys._getframe(depth + 1)
        while f is not None:
            name = f.f_code.co_filename
            if self.is_user(name):
                return name, f.f_lineno
            f = f.f_back
        return None

    def trim_traceback(self, tb: TracebackType | None) -> list[dict]:
        """The user's frames of a traceback, outermost first, as dicts (file, line, function, text)."""
        out = []
        for fs in traceback.extract_tb(tb):
            if self.is_user(fs.filename):
                out.append({"file": fs.filename, "line": fs.lineno or 0, "function": fs.name,
                            "text": (fs.line or "").strip()})
        return out
