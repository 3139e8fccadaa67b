"""The compiled-step comparison: a second, short run of the script with its models under torch.compile.

Eager mode dispatches one XLA program per op, so a step of many small ops costs host time per op; under
torch.compile(backend="tpu") the forward and backward are one program each. How much that saves depends on the
script, so diagnose measures it: `ModelCompiler` (installed in the child by `--compile-models`) calls
`module.compile(backend="tpu")` on each top-level module with parameters that the user's code calls, at its
first call (that call stays eager; the next ones run compiled), and records where. The parent compares the
steady-state step time of that run with the eager run's (`tputool.diagnose.cost`).
"""

from __future__ import annotations

from typing import Any

import torch

from tputool.diagnose.userframes import UserFrames

COMPARE_STEPS = 8
"""Optimizer steps of the compiled run (its second half is the steady state measured)."""
MIN_STEPS = 4
"""The eager run needs this many steps for the comparison to be made (a steady state on both sides)."""


class ModelCompiler:
    """Compiles each top-level user-called module with parameters at its first call (global module hooks)."""

    def __init__(self, frames: UserFrames) -> None:
        self.frames = frames
        self.compiled: list[dict[str, Any]] = []  # {"cls", "file", "line"} per module compiled
        self._depth = 0
        self._seen: set[int] = set()
        self._handles: list[Any] = []

    def install(self) -> None:
        """Register the global forward pre-hook and (always called) forward hook."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [register_module_forward_pre_hook(self._enter),
                         register_module_forward_hook(self._exit, always_call=True)]

    def remove(self) -> None:
        """Unregister the hooks (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def _enter(self, module: torch.nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling():
            return
        self._depth += 1
        if self._depth > 1 or id(module) in self._seen or type(module).__name__ == "OptimizedModule":
            return
        self._seen.add(id(module))
        loc = self.frames.location(1)
        if loc is None or next(module.parameters(), None) is None:
            return
        module.compile(backend="tpu")  # from its next call on (this one has already chosen its forward)
        self.compiled.append({"cls": type(module).__name__, "file": loc[0], "line": loc[1]})

    def _exit(self, module: torch.nn.Module, args: tuple, output: Any) -> None:
        if torch.compiler.is_compiling() or self._depth == 0:
            return
        self._depth -= 1
