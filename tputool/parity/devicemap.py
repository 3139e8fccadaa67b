"""The reference side of `tputool parity`: the script's `tpu` device mapped to another device (cpu, cuda).

A TorchFunctionMode rewrites every `device=` argument and every `.to(...)` target naming `tpu`, and
`Tensor.tpu()` / `Module.tpu()` become moves to the target; `torch.autocast("tpu", dtype)` becomes
`torch.autocast(target, dtype)` (or no autocast at all with `fp32=True`: the reference then runs float32).
`install(target, fp32)` installs all of it and returns the function that removes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map


def _is_tpu(d: Any) -> bool:
    if isinstance(d, torch.device):
        return d.type == "tpu"
    return isinstance(d, str) and (d == "tpu" or d.startswith("tpu:"))


class DeviceMap(TorchFunctionMode):
    """Rewrites `tpu` devices in the arguments of every torch function to `target`; with `tensors=True` also
    reads the tpu tensors among them onto `target` (a copy: what the function does to it stays there)."""

    def __init__(self, target: str, tensors: bool = False) -> None:
        super().__init__()
        self.target = torch.device(target)
        self.tensors = tensors

    def _read(self, x: Any) -> Any:
        return x.detach().to(self.target) if isinstance(x, torch.Tensor) and x.device.type == "tpu" else x

    def _map(self, x: Any) -> Any:
        return self.target if _is_tpu(x) else x

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs and _is_tpu(kwargs["device"]):
            kwargs = {**kwargs, "device": self.target}
        if args and any(_is_tpu(a) for a in args):
            args = tuple(self._map(a) for a in args)
        if self.tensors:
            args, kwargs = tree_map(self._read, args), tree_map(self._read, kwargs)
        return func(*args, **kwargs)


def install(target: str = "cpu", fp32: bool = False) -> Callable[[], None]:
    """Map `tpu` to `target` for the rest of the process (see the module doc); returns the undo function."""
    mode = DeviceMap(target)
    mode.__enter__()
    amp = torch.amp.autocast_mode.autocast
    orig_init = amp.__init__
    orig_tensor_tpu = getattr(torch.Tensor, "tpu", None)
    orig_module_tpu = getattr(torch.nn.Module, "tpu", None)

    def init(self, device_type: str, dtype: torch.dtype | None = None, enabled: bool = True,
             cache_enabled: bool | None = None) -> None:
        if device_type == "tpu":
            device_type = mode.target.type
            if fp32:
                enabled = False
            if dtype is None:
                dtype = torch.bfloat16
        orig_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    amp.__init__ = init
    torch.Tensor.tpu = lambda self, *a, **k: self.to(mode.target)
    torch.nn.Module.tpu = lambda self, *a, **k: self.to(mode.target)

    def undo() -> None:
        amp.__init__ = orig_init
        for cls, orig in ((torch.Tensor, orig_tensor_tpu), (torch.nn.Module, orig_module_tpu)):
            if orig is not None:
                cls.tpu = orig
        try:
            mode.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - the script left its own mode on the stack
            pass

    return undo
