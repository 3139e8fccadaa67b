"""torch.save / torch.load / copy.deepcopy for tpu tensors, and host-side pinning.

tpu storages hold JAX arrays, not bytes, so PyTorch's storage-level paths cannot read them. `install()`:
- pickles a tpu tensor as its CPU copy plus its device (as PyTorch does for XLA), so `torch.save` works and
  `torch.load` puts it back on tpu (or where `map_location` says);
- deep-copies a tpu tensor by cloning it (values, requires_grad, grad);
- lets `torch.load(..., map_location="tpu")` restore CPU checkpoints straight onto the device (the bytes
  become a tpu storage; `set_` reinterprets them as the tensor's dtype, see kernels.set_storage).
Storage sharing between tensors of one checkpoint is not preserved for tpu tensors (as for XLA).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from tputool.backend import tensor as tt

_installed = False


def _is_tpu(t: torch.Tensor) -> bool:
    return t.device.type == "tpu" and tt.has_data(t)


def _restore_tpu(obj, location: str):
    if not str(location).startswith("tpu"):
        return None
    if isinstance(obj, torch.storage.TypedStorage):
        obj = obj._untyped_storage
    if obj.device.type == "tpu":
        return obj
    raw = np.frombuffer(bytes(obj), dtype=np.uint8) if obj.nbytes() else np.zeros((0,), np.uint8)
    return tt.from_jax(jnp.asarray(raw)).untyped_storage()


def install() -> None:
    """Patch Tensor pickling and deepcopy for tpu tensors, and register the `tpu` load location (once)."""
    global _installed
    if _installed:
        return
    reduce_internal = torch.Tensor._reduce_ex_internal
    deepcopy = torch.Tensor.__deepcopy__

    def _reduce_ex_internal(self, proto):
        if _is_tpu(self):
            return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                    (self.detach().cpu(), self.dtype, str(self.device), self.requires_grad))
        return reduce_internal(self, proto)

    def __deepcopy__(self, memo):  # noqa: N807 - the dunder being replaced
        if not _is_tpu(self) or type(self) is not torch.Tensor:
            return deepcopy(self, memo)
        if id(self) in memo:
            return memo[id(self)]
        with torch.no_grad():
            new = self.clone()
        new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = self.grad.__deepcopy__(memo)
        new.__dict__ = {k: __import__("copy").deepcopy(v, memo) for k, v in self.__dict__.items()}
        memo[id(self)] = new
        return new

    torch.Tensor._reduce_ex_internal = _reduce_ex_internal
    torch.Tensor.__deepcopy__ = __deepcopy__
    torch.serialization.register_package(5, lambda obj: "tpu" if obj.device.type == "tpu" else None, _restore_tpu)
    _installed = True


_PINNED = "_tputool_pinned"
"""Attribute marking a CPU storage as pinned for tpu (kept on the storage's Python object, as `_tpu` is)."""


def install_pin_memory() -> None:
    """`Tensor.pin_memory()` for the tpu accelerator: host buffers need no pinning for JAX transfers, so
    pinning (DataLoader(pin_memory=True)) marks the tensor's storage pinned and returns the tensor itself,
    instead of failing in PyTorch's PrivateUse1 hooks, which cannot provide a pinned allocator from Python;
    `is_pinned()` then reports True, as on CUDA (unlike CUDA, the source tensor is the pinned one: no copy)."""
    original = torch.Tensor.pin_memory
    if getattr(original, "_tputool", False):
        return
    original_is_pinned = torch.Tensor.is_pinned

    def is_pinned(self, device=None):
        if self.layout is torch.strided and getattr(self.untyped_storage(), _PINNED, False):
            return True
        return original_is_pinned(self) if device is None else original_is_pinned(self, device)

    def pin_memory(self, device=None):
        if device is not None:
            target = torch.device(device)
        else:
            acc = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
            target = acc if acc is not None else torch.device("cpu")
        if self.device.type == "cpu" and target.type == "tpu":
            if self.layout is torch.strided:
                setattr(self.untyped_storage(), _PINNED, True)
            return self
        return original(self, device) if device is not None else original(self)

    pin_memory._tputool = True
    torch.Tensor.pin_memory = pin_memory
    torch.Tensor.is_pinned = is_pinned
