"""Iterations of loops without an optimizer (inference, eval, `generate`): calls of a top-level nn.Module.

A top-level call is a model's forward entered while no other module's forward runs (a compiled model's
`OptimizedModule` call counts once); a module that holds no parameter or buffer is no model (`is_model`:
torchvision's transforms are modules, called once per sample). Each one is an iteration, as an optimizer step is for a training loop:
`CallCounter` counts them through global module hooks until the first optimizer step (then steps take over
and the hooks go quiet: removing them would change `len(_global_forward_hooks)`, which Dynamo guards on, and
recompile every compiled function), and records per calling user line the input shapes of the calls that compiled
new XLA programs, so that per-shape recompiles can be reported at that line with the dimension that varies.
When ops are deferred (Fused mode), a call's programs compile at the first flush after it returns (the loop's
sync point, e.g. reading the new token): the compiles up to that flush count as the call's.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from tputool.diagnose.userframes import UserFrames

MAX_COMPILING_CALLS = 64  # per call site: the compiling calls kept (index, compiles, shapes)
GENERATE_NAMES = frozenset({"generate"})  # a top-level call made under one of these is a generation loop


def is_model(module: torch.nn.Module) -> bool:
    """Whether a top-level module call can be the loop's model: the module (or a submodule) holds a parameter or
    a buffer. Stateless modules (torchvision's `transforms.Resize`, a loss) are not iterations of a loop."""
    return next(module.parameters(), None) is not None or next(module.buffers(), None) is not None


class CallCounter:
    """Counts top-level module calls; per user call site, which calls compiled XLA programs and their shapes."""

    def __init__(self, frames: UserFrames, events_log: Callable[[], list[dict]],
                 deferred: Callable[[], bool] = lambda: False) -> None:
        self.frames = frames
        self.events_log = events_log  # the backend's event log (`tputool.backend.events.log`)
        self.deferred = deferred  # whether ops are deferred now (their programs compile at a later flush)
        self.calls = 0
        self.ends: list[float] = []  # time.perf_counter() when each top-level call returned
        self.on_call: list[Callable[[int], None]] = []
        self.sites: dict[tuple[str, int], dict[str, Any]] = {}
        self._depth = 0
        self._site: dict[str, Any] | None = None
        self._start = 0  # len(events_log()) when the current top-level call began
        self._pending: tuple | None = None  # (site, index, shapes, start, end) of a call whose flush is awaited
        self._names: dict[type, tuple[str, ...]] = {}
        self._handles: list[Any] = []
        self.active = True

    def install(self) -> None:
        """Register the global forward pre-hook and (always called) forward hook."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [register_module_forward_pre_hook(self._enter),
                         register_module_forward_hook(self._exit, with_kwargs=True, always_call=True)]

    def stop(self) -> None:
        """Stop counting; the hooks stay registered (a change in their number recompiles compiled code)."""
        self._close_pending()
        self.active = False

    def remove(self) -> None:
        """Unregister the hooks (idempotent); only once the script has ended."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def _enter(self, module: torch.nn.Module, args: tuple) -> None:
        if torch.compiler.is_compiling() or not self.active:  # is_compiling first: Dynamo then reads nothing
            return
        if not self._depth and not is_model(module):  # (its _exit sees depth 0 and returns too)
            return
        self._depth += 1
        if self._depth > 1:
            return
        self._close_pending()
        loc = self.frames.location(1)
        if loc is None:  # called by a library outside any user frame: not the user's loop
            self._site = None
            return
        site = self.sites.get(loc)
        if site is None:
            site = self.sites[loc] = {"file": loc[0], "line": loc[1], "calls": 0, "generate": _under_generate(),
                                      "compiling": []}
        self._site = site
        self._start = len(self.events_log())

    def _exit(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if torch.compiler.is_compiling() or not self.active or self._depth == 0:
            return
        self._depth -= 1
        if self._depth:
            return
        self.calls += 1
        self.ends.append(time.perf_counter())
        site = self._site
        if site is not None:
            call = (site, site["calls"], self._shapes(module, args, kwargs), self._start, len(self.events_log()))
            site["calls"] += 1
            if self.deferred():
                self._pending = call
            else:
                self._note_compiles(*call, flush_ends=False)
        for fn in self.on_call:
            fn(self.calls)

    def _close_pending(self) -> None:
        if self._pending is not None:
            call, self._pending = self._pending, None
            self._note_compiles(*call, flush_ends=True)

    def _note_compiles(self, site: dict, index: int, shapes: dict, start: int, end: int, flush_ends: bool) -> None:
        """Record call `index` of `site` if it compiled: the compile events logged from its start to its end
        (with `flush_ends`: to the first flush at or after its end, when one came)."""
        log = self.events_log()
        if len(log) < end:  # (the log was reset meanwhile: nothing to attribute)
            return
        if flush_ends:
            end = next((i for i in range(end, len(log)) if log[i]["kind"] == "flush"), end)
        compiled = sum(e["kind"] == "compile" for e in log[start:end])
        if compiled and len(site["compiling"]) < MAX_COMPILING_CALLS:
            site["compiling"].append([index, compiled, shapes])

    def _shapes(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> dict[str, list[int]]:
        """Input tensors by parameter name (args[i] when the name is unknown) -> shape."""
        names = self._names.get(type(module))
        if names is None:
            names = self._names[type(module)] = _param_names(module)
        out = {}
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                out[names[i] if i < len(names) else f"args[{i}]"] = list(a.shape)
        for k, v in kwargs.items():
            if isinstance(v, torch.Tensor):
                out[k] = list(v.shape)
        return out

    def to_record(self) -> list[dict[str, Any]]:
        """The call sites as JSON-ready dicts: file, line, calls, generate, compiling [[index, compiles, shapes]]."""
        self._close_pending()
        return list(self.sites.values())


def _param_names(module: torch.nn.Module) -> tuple[str, ...]:
    import inspect

    fn = getattr(getattr(module, "_orig_mod", module), "forward", None)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _under_generate() -> bool:
    """True when a function named `generate` is on the stack (a Hugging Face style generation loop)."""
    f = sys._getframe(2)
    while f is not None:
        if f.f_code.co_name in GENERATE_NAMES:
            return True
        f = f.f_back
    return False
