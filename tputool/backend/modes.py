"""Eager execution modes of the tpu backend (torch.tpu.EagerMode) and the current one.

`current` is read on every op by the eager dispatcher, and by the fused-mode engine in
`tputool.backend.fused` (DEFER_AND_FUSE), which installs itself through `set_fuse_hook`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable


class EagerMode(enum.Enum):
    """How eager ops run: Debug, Strict (the default) or Fused, named as in torch_tpu."""

    DEFER_NEVER_AND_LAUNCH_BLOCKING = "debug"
    """Debug: each op is compiled and run at once, and the host waits for it (errors point at the caller)."""
    DEFER_NEVER = "strict"
    """Strict: each op runs as its own cached, compiled kernel, asynchronously."""
    DEFER_AND_FUSE = "fused"
    """Fused: ops are deferred and fused into larger compiled computations (tputool.backend.fused)."""


current: EagerMode = EagerMode.DEFER_NEVER
"""The mode in force."""

blocking: bool = False
"""True in Debug mode: the dispatcher blocks on each op's outputs."""

_fuse_hook: Callable[[EagerMode, EagerMode], None] | None = None


def set_fuse_hook(hook: Callable[[EagerMode, EagerMode], None] | None) -> None:
    """Install the fused-mode engine's callback, called as hook(old, new) on every mode change."""
    global _fuse_hook
    _fuse_hook = hook


def set_mode(mode: EagerMode) -> None:
    """Make `mode` current (raises ValueError for a non-EagerMode, RuntimeError if Fused is unavailable)."""
    global current, blocking
    if not isinstance(mode, EagerMode):
        raise ValueError(f"expected a torch.tpu.EagerMode, got {mode!r}")
    if mode is EagerMode.DEFER_AND_FUSE and _fuse_hook is None:
        try:
            import tputool.backend.fused  # noqa: F401 - installs the hook
        except ImportError:
            pass
        if _fuse_hook is None:
            raise RuntimeError("EagerMode.DEFER_AND_FUSE needs the fused engine (tputool.backend.fused), "
                               "which is not available in this install")
    old, current = current, mode
    blocking = mode is EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING
    if _fuse_hook is not None:
        _fuse_hook(old, mode)
