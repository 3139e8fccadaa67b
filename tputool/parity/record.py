"""What a parity child records: every module call's output and every parameter's gradient, per step.

`Recorder.install()` registers global hooks: a module forward pre-hook (names the modules of each top-level
module the first time it is called, keeps the call stack), a forward hook (records the call's first tensor
output, keyed `step/out/name#call`), and an optimizer step pre-hook (records each parameter's `.grad`, keyed
`step/grad/name`). A step ends at an optimizer step; a script without one (inference) ends a step at the end
of each call of its first top-level module. After `max_steps` steps `StepLimit` stops the script. The inputs
of the first top-level module's calls are recorded too (`step/in/name#call`), so data that differs shows up
before the layers it feeds.

Each entry: key, kind (in | out | grad), name, cls, step, call, file, line (the user's call site), dtype,
shape, autocast (dtype name or None), random (a dropout in training mode ran in this call), fallbacks (CPU
fallback ops of the backend inside this call), carried (the lowest floating precision the run had passed
through when this value was made: its own dtype, its module's autocast dtype unless autocast runs that module
in float32, and every earlier record's; a value computed from bfloat16 results carries bfloat16 error whatever
its dtype) and value (a float32 CPU copy) or, above `max_bytes`, stats.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tputool.diagnose.userframes import UserFrames
from tputool.parity.compare import MANTISSA_BITS

FLOAT32_UNDER_AUTOCAST = (torch.nn.modules.normalization.LayerNorm, torch.nn.modules.normalization.GroupNorm,
                          torch.nn.modules.batchnorm._NormBase, torch.nn.Embedding, torch.nn.EmbeddingBag,
                          torch.nn.Softmax, torch.nn.LogSoftmax, torch.nn.modules.loss._Loss,
                          *((torch.nn.RMSNorm,) if hasattr(torch.nn, "RMSNorm") else ()))
"""Module classes autocast runs in float32: their output keeps the precision of their inputs."""
RANDOM_MODULES = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
                  torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)


class StepLimit(BaseException):
    """Raised from a hook once the recorded steps are done: the script stops there."""


def first_tensor(x: Any) -> torch.Tensor | None:
    """The first tensor in a module's output (a tensor, tuple, list, dict or a dataclass-like output)."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, list | tuple):
        items = x
    elif isinstance(x, dict):
        items = list(x.values())
    elif hasattr(x, "__dict__") and not isinstance(x, type):
        items = list(vars(x).values())
    else:
        return None
    for v in items:
        t = first_tensor(v) if isinstance(v, list | tuple | dict | torch.Tensor) else None
        if t is not None:
            return t
    return None


def capture(t: torch.Tensor, max_bytes: int) -> dict:
    """A tensor as a record: dtype, shape and a float32 CPU copy, or only summary stats above `max_bytes`."""
    t = t.detach()
    out: dict = {"dtype": str(t.dtype), "shape": list(t.shape), "value": None, "stats": None}
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.numel() * 4 > max_bytes:
        f = t.float()
        out["stats"] = {"mean": float(f.mean()), "std": float(f.std()) if f.numel() > 1 else 0.0,
                        "norm": float(f.norm())}
        return out
    out["value"] = t.to("cpu", torch.float32 if t.is_floating_point() else t.dtype, copy=True)
    return out


def autocast_dtype() -> str | None:
    """The dtype of the innermost enabled autocast (tpu, cuda or cpu), or None outside autocast."""
    for dev in ("tpu", "cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(dev):
                return str(torch.get_autocast_dtype(dev))
        except (RuntimeError, ValueError):
            continue
    return None


def fallback_count() -> int:
    """CPU fallback ops the bundled backend has run so far (0 without it)."""
    import sys

    events = sys.modules.get("tputool.backend.events")
    return events.total("fallback") if events is not None else 0


def lowest(dtypes: list[str | None]) -> str | None:
    """The floating dtype name with the fewest mantissa bits among `dtypes` (None entries and others skipped)."""
    known = [d for d in dtypes if d in MANTISSA_BITS]
    return min(known, key=MANTISSA_BITS.__getitem__) if known else None


class Recorder:
    """Records module outputs and parameter gradients of the first `max_steps` steps (see the module doc)."""

    def __init__(self, frames: UserFrames, max_steps: int, max_bytes: int) -> None:
        self.frames, self.max_steps, self.max_bytes = frames, max_steps, max_bytes
        self.entries: list[dict] = []
        self.step = 0
        self.optimizer_steps = 0
        self.names: dict[int, str] = {}
        self.param_names: dict[int, str] = {}
        self.stack: list[tuple[torch.nn.Module, int, bool]] = []  # (module, fallbacks at entry, random)
        self.calls: dict[tuple[int, str], int] = {}
        self.first_root: int | None = None
        self.paused = False
        self.on_entry: list[Callable[[dict, torch.nn.Module, tuple, dict, Any], None]] = []
        self._handles: list = []
        self._roots: dict[str, int] = {}
        self.carried: str | None = None  # the lowest floating precision recorded so far (see the module doc)

    def install(self) -> None:
        """Register the global module and optimizer hooks."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles = [register_module_forward_pre_hook(self._pre), register_module_forward_hook(self._post, with_kwargs=True),
                         register_optimizer_step_pre_hook(self._grads),
                         register_optimizer_step_post_hook(self._stepped)]

    def remove(self) -> None:
        """Unregister every hook."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def _name_root(self, module: torch.nn.Module) -> None:
        base = type(module).__name__
        n = self._roots.get(base, 0)
        self._roots[base] = n + 1
        root = base if n == 0 else f"{base}_{n + 1}"
        for name, sub in module.named_modules():
            self.names.setdefault(id(sub), f"{root}.{name}" if name else root)
        for name, p in module.named_parameters():
            self.param_names.setdefault(id(p), f"{root}.{name}")

    def _pre(self, module: torch.nn.Module, args: tuple) -> None:
        if self.paused:
            return
        if not self.stack:
            if id(module) not in self.names:
                self._name_root(module)
            if self.first_root is None:
                self.first_root = id(module)
            if id(module) == self.first_root:
                if self.optimizer_steps == 0 and self.step >= self.max_steps:
                    raise StepLimit()  # an inference loop: max_steps top-level calls are recorded
                t = first_tensor(args)
                if t is not None and t.is_floating_point():
                    self._add("in", self.names[id(module)], module, t)
        is_random = isinstance(module, RANDOM_MODULES) and module.training
        if is_random:
            for i in range(len(self.stack)):
                m, fb, _ = self.stack[i]
                self.stack[i] = (m, fb, True)
        self.stack.append((module, fallback_count(), is_random))

    def _add(self, kind: str, name: str, module: torch.nn.Module | None, t: torch.Tensor,
             random: bool = False, fallbacks: int = 0) -> dict:
        call = self.calls.get((self.step, kind + name), 0)
        self.calls[(self.step, kind + name)] = call + 1
        where = self.frames.location(2) or ("", 0)
        amp = autocast_dtype()
        made_in = [str(t.dtype)] if t.is_floating_point() else []
        if kind == "out" and amp is not None and not isinstance(module, FLOAT32_UNDER_AUTOCAST):
            made_in.append(amp)
        self.carried = lowest([self.carried, *made_in])
        entry = {"key": f"{self.step}/{kind}/{name}#{call}", "kind": kind, "name": name,
                 "cls": type(module).__name__ if module is not None else "Parameter", "step": self.step,
                 "call": call, "file": where[0], "line": where[1], "autocast": amp,
                 "random": random, "fallbacks": fallbacks, "carried": self.carried, **capture(t, self.max_bytes)}
        self.entries.append(entry)
        return entry

    def _post(self, module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        if self.paused or not self.stack:
            return
        _, fb0, is_random = self.stack.pop()
        name = self.names.get(id(module), type(module).__name__)
        t = first_tensor(output)
        if t is not None:
            entry = self._add("out", name, module, t, is_random, fallback_count() - fb0)
            for fn in self.on_entry:
                fn(entry, module, args, kwargs, output)
        if not self.stack and self.optimizer_steps == 0 and id(module) == self.first_root:
            self.step += 1
            self.calls.clear()

    def _grads(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        if self.optimizer_steps == 0 and self.step > 0:
            self._renumber()
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._add("grad", self.param_names.get(id(p), f"param{len(self.param_names)}"), None, p.grad)

    def _renumber(self) -> None:
        """Training after all: the top-level calls before the first optimizer step were all its step 0."""
        self.calls.clear()
        for e in self.entries:
            n = self.calls.get((0, e["kind"] + e["name"]), 0)
            self.calls[(0, e["kind"] + e["name"])] = n + 1
            e["step"], e["call"], e["key"] = 0, n, f"0/{e['kind']}/{e['name']}#{n}"
        self.step = 0

    def _stepped(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        self.optimizer_steps += 1
        self.step += 1
        self.calls.clear()
        if self.step >= self.max_steps:
            raise StepLimit()
