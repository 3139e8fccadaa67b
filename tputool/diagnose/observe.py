"""What the diagnose child watches while the user's script runs: a TorchFunctionMode and an optimizer hook.

The mode sees every torch call made from Python with its stack, so it records, at the user's file:line,
host syncs (`.item()`, `.cpu()`, printing a tensor, `bool(t)`, ...), float64/float16 tensors created or
converted, ops with data-dependent output shapes, and matmul/linear/conv/attention shapes that pad badly
on the MXU. It never changes what a call returns. Inside torch.compile tracing it passes calls straight
through, so it adds no graph breaks. The step counter counts optimizer steps and stops the script after
`max_steps`.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from tputool.diagnose.rules import DIM_MULTIPLE
from tputool.diagnose.userframes import UserFrames


class StepLimitReached(BaseException):
    """Raised out of `optimizer.step()` once --max-steps steps ran (BaseException: user `except` misses it)."""


class StepCounter:
    """Counts optimizer steps through a global step post-hook; raises StepLimitReached after `max_steps`."""

    def __init__(self, max_steps: int | None) -> None:
        self.steps = 0
        self.iteration = 0  # iterations done: optimizer steps, or top-level model calls before any step
        self.step_ends: list[float] = []  # time.perf_counter() when each step finished
        self.max_steps = max_steps
        self.on_step: list[Callable[[int], None]] = []
        self._handle = None

    def install(self) -> None:
        """Register the global optimizer step post-hook."""
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(self._hook)

    def remove(self) -> None:
        """Unregister the hook."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        self.iteration = self.steps
        self.step_ends.append(time.perf_counter())
        for fn in self.on_step:
            fn(self.steps)
        if self.max_steps is not None and self.steps >= self.max_steps:
            raise StepLimitReached(self.steps)


_T = torch.Tensor
# Calls that wait for the device and copy a value to the host -> the kind shown in the report.
SYNC_CALLS: dict[Any, str] = {
    _T.item: ".item()", _T.tolist: ".tolist()", _T.numpy: ".numpy()", _T.__array__: "np.asarray(tensor)",
    _T.cpu: ".cpu()", _T.__bool__: "bool(tensor) / if tensor:", _T.__float__: "float(tensor)",
    _T.__int__: "int(tensor)", _T.__index__: "tensor used as an index", _T.__repr__: "print(tensor)",
    _T.__format__: "f-string of a tensor",
}
# Calls whose output shape depends on the data.
DYNAMIC_SHAPE_CALLS: dict[Any, str] = {
    torch.nonzero: "nonzero", _T.nonzero: "nonzero", torch.argwhere: "argwhere", _T.argwhere: "argwhere",
    torch.unique: "unique", _T.unique: "unique", torch.masked_select: "masked_select",
    _T.masked_select: "masked_select", torch.unique_consecutive: "unique_consecutive",
}
# torch's own files between a user's call and the mode (Python-level Tensor methods, the override machinery,
# the mode behind torch.set_default_device).
_TPUTOOL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_DISPATCH_FILES = (os.path.join("torch", "overrides.py"), os.path.join("torch", "_tensor.py"),
                   os.path.join("torch", "_tensor_str.py"), os.path.join("torch", "utils", "_device.py"))
_WATCHED_DTYPES = {torch.float64: "float64", torch.float16: "float16"}


def _mm_dims(a: Any, b: Any) -> tuple[int, int, int] | None:
    if not (isinstance(a, _T) and isinstance(b, _T)) or a.dim() < 2 or b.dim() < 2:
        return None
    return math.prod(a.shape[:-1]), a.shape[-1], b.shape[-1]


def _linear(args: tuple, kwargs: dict) -> tuple[str, dict] | None:
    x = args[0] if args else kwargs.get("input")
    w = args[1] if len(args) > 1 else kwargs.get("weight")
    if not (isinstance(x, _T) and isinstance(w, _T)) or x.dim() < 1 or w.dim() != 2:
        return None
    return "linear", {"M": math.prod(x.shape[:-1]), "K": x.shape[-1], "N": w.shape[0]}


def _matmul(args: tuple, kwargs: dict) -> tuple[str, dict] | None:
    dims = _mm_dims(args[0], args[1]) if len(args) > 1 else None
    return ("matmul", dict(zip("MKN", dims, strict=True))) if dims else None


def _addmm(args: tuple, kwargs: dict) -> tuple[str, dict] | None:
    dims = _mm_dims(args[1], args[2]) if len(args) > 2 else None
    return ("addmm", dict(zip("MKN", dims, strict=True))) if dims else None


def _conv(args: tuple, kwargs: dict) -> tuple[str, dict] | None:
    w = args[1] if len(args) > 1 else kwargs.get("weight")
    if not isinstance(w, _T) or w.dim() < 3:
        return None
    groups = args[6] if len(args) > 6 else kwargs.get("groups", 1)
    return "conv", {"K": w.shape[1] * int(groups), "N": w.shape[0]}


def _sdpa(args: tuple, kwargs: dict) -> tuple[str, dict] | None:
    q = args[0] if args else kwargs.get("query")
    if not isinstance(q, _T) or q.dim() < 2:
        return None
    return "attention", {"M": q.shape[-2], "head_dim": q.shape[-1]}


SHAPE_CALLS: dict[Any, Callable[[tuple, dict], tuple[str, dict] | None]] = {
    torch._C._nn.linear: _linear, torch.matmul: _matmul, _T.matmul: _matmul, torch.mm: _matmul,
    _T.mm: _matmul, torch.bmm: _matmul, _T.bmm: _matmul, torch.addmm: _addmm, _T.addmm: _addmm,
    torch.baddbmm: _addmm, torch.conv1d: _conv, torch.conv2d: _conv, torch.conv3d: _conv,
    torch._C._nn.scaled_dot_product_attention: _sdpa,
}
_WATCHED_CALLS = frozenset((*SYNC_CALLS, *DYNAMIC_SHAPE_CALLS, *SHAPE_CALLS, _T.to, _T.__getitem__))


def _device_type(t: Any) -> str:
    return t.device.type if isinstance(t, _T) else "?"


def _has_dtype(args: tuple, kwargs: dict, dtype: torch.dtype, device: str) -> bool:
    """Whether a tensor argument already has `dtype` on a `device` device (then the output is not where that
    dtype was made or entered the device)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, _T):
            if a.dtype == dtype and a.device.type == device:
                return True
        elif isinstance(a, list | tuple):
            if any(isinstance(x, _T) and x.dtype == dtype and x.device.type == device for x in a):
                return True
    return False


def _is_cpu_target(args: tuple, kwargs: dict) -> bool:
    """True for `.to(...)` calls whose target device is the CPU."""
    for a in (*args[1:], kwargs.get("device")):
        if isinstance(a, torch.device):
            return a.type == "cpu"
        if isinstance(a, str):
            return a == "cpu" or a.startswith("cpu:")
        if isinstance(a, _T):
            return a.device.type == "cpu"
    return False


class Observer(TorchFunctionMode):
    """Records host syncs, float64/float16, dynamic-shape ops and MXU shapes at the user's file:line."""

    def __init__(self, frames: UserFrames, steps: StepCounter) -> None:
        super().__init__()
        self.frames = frames
        self.steps = steps
        # (kind, file, line, device, called directly by user code) -> [count, distinct steps, last step]
        self.syncs: dict[tuple[str, str, int, str, bool], list[int]] = {}
        self.dtypes: dict[tuple[str, str, str, int, str], int] = {}  # (dtype, op, file, line, device) -> n
        self.dynamic: dict[tuple[str, str, int], int] = {}  # (op, file, line) -> n
        self.shapes: dict[tuple[str, str, int, str], int] = {}  # (op, file, line, dims json) -> n
        self.devices: set[str] = set()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if kwargs is None:
            kwargs = {}
        if torch.compiler.is_compiling():
            return func(*args, **kwargs)
        if func in _WATCHED_CALLS:
            kind = SYNC_CALLS.get(func)
            if kind is not None and not (func is _T.cpu and _device_type(args[0]) == "cpu"):
                self._sync(kind, args)
            elif func is _T.to and args and _is_cpu_target(args, kwargs) and _device_type(args[0]) != "cpu":
                self._sync(".to('cpu')", args)
            elif func is _T.__getitem__ and len(args) > 1 and _bool_index(args[1]):
                self._dynamic("boolean-mask indexing")
            else:
                dyn = DYNAMIC_SHAPE_CALLS.get(func)
                if dyn is not None:
                    self._dynamic(dyn)
                shape = SHAPE_CALLS.get(func)
                if shape is not None:
                    self._shape(shape, args, kwargs)
        out = func(*args, **kwargs)
        if isinstance(out, _T):
            if func is _T.to or "device" in kwargs:
                self.devices.add(out.device.type)
            name = _WATCHED_DTYPES.get(out.dtype)
            if name is not None and not _has_dtype(args, kwargs, out.dtype, out.device.type):
                self._dtype(name, func, out.device.type)  # (made here, or moved here to another device)
        return out

    def _sync(self, kind: str, args: tuple) -> None:
        origin = self._origin(sys._getframe(2))
        loc = self.frames.location(2) if origin != "tputool" else None
        if loc is None:
            return
        key = (kind, loc[0], loc[1], _device_type(args[0]) if args else "?", origin == "user")
        rec = self.syncs.get(key)
        step = self.steps.iteration
        if rec is None:
            self.syncs[key] = [1, 1, step]
        else:
            rec[0] += 1
            if rec[2] != step:
                rec[1] += 1
                rec[2] = step

    def _origin(self, f: FrameType | None) -> str:
        """Who made the call: "user" (the script's own code), "tputool" (our backend: not the user's doing),
        or "lib" (a library such as torch.optim on the user's behalf)."""
        while f is not None and f.f_code.co_filename.endswith(_DISPATCH_FILES):
            f = f.f_back
        if f is None:
            return "lib"
        name = f.f_code.co_filename
        if name.startswith(_TPUTOOL_DIR):
            return "tputool"
        return "user" if self.frames.is_user(name) else "lib"

    def _dynamic(self, op: str) -> None:
        loc = self.frames.location(2) if self._origin(sys._getframe(2)) != "tputool" else None
        if loc is not None:
            key = (op, *loc)
            self.dynamic[key] = self.dynamic.get(key, 0) + 1

    def _shape(self, fn: Callable[[tuple, dict], tuple[str, dict] | None], args: tuple, kwargs: dict) -> None:
        got = fn(args, kwargs)
        if got is None:
            return
        op, dims = got
        bad = {d: v for d, v in dims.items() if v % DIM_MULTIPLE[d]}
        if not bad:
            return
        loc = self.frames.location(2) if self._origin(sys._getframe(2)) != "tputool" else None
        if loc is not None:
            key = (op, loc[0], loc[1], ",".join(f"{d}={v}" for d, v in dims.items()))
            self.shapes[key] = self.shapes.get(key, 0) + 1

    def _dtype(self, name: str, func: Any, device: str) -> None:
        loc = self.frames.location(2) if self._origin(sys._getframe(2)) != "tputool" else None
        if loc is not None:
            key = (name, getattr(func, "__name__", str(func)), *loc, device)
            self.dtypes[key] = self.dtypes.get(key, 0) + 1

    def to_record(self) -> dict:
        """The observations as JSON-ready lists. A sync's `steps_seen` leaves out the run's tail (after the last
        iteration ended: a final evaluation) unless it was seen only there."""
        end = self.steps.iteration
        return {
            "host_syncs": [{"kind": k, "file": f, "line": ln, "device": d, "direct": direct, "count": n,
                            "steps_seen": s - (last == end and s > 1)}
                           for (k, f, ln, d, direct), (n, s, last) in self.syncs.items()],
            "dtypes": [{"dtype": d, "op": op, "file": f, "line": ln, "device": dev, "count": n}
                       for (d, op, f, ln, dev), n in self.dtypes.items()],
            "dynamic_shapes": [{"op": op, "file": f, "line": ln, "count": n}
                               for (op, f, ln), n in self.dynamic.items()],
            "shapes": [{"op": op, "file": f, "line": ln, "dims": dict(_parse_dims(dims)), "count": n}
                       for (op, f, ln, dims), n in self.shapes.items()],
            "devices": sorted(self.devices - {"meta"}),
        }


def _bool_index(idx: Any) -> bool:
    if isinstance(idx, _T):
        return idx.dtype == torch.bool
    if isinstance(idx, tuple):
        return any(isinstance(i, _T) and i.dtype == torch.bool for i in idx)
    return False


def _parse_dims(s: str) -> list[tuple[str, int]]:
    return [(k, int(v)) for k, v in (p.split("=") for p in s.split(","))]


def wrap_from_numpy(frames: UserFrames, observer: Observer) -> Callable[[], None]:
    """Patch torch.from_numpy (invisible to function modes) to report float64/float16 arrays; returns undo."""
    original = torch.from_numpy

    def from_numpy(array: Any) -> torch.Tensor:
        out = original(array)
        name = _WATCHED_DTYPES.get(out.dtype)
        if name is not None:
            loc = frames.location(1)
            if loc is not None:
                key = (name, "from_numpy", *loc, "cpu")
                observer.dtypes[key] = observer.dtypes.get(key, 0) + 1
        return out

    torch.from_numpy = from_numpy

    def undo() -> None:
        torch.from_numpy = original

    return undo
