"""`UntypedStorage` methods on tpu storages: size/nbytes, resize_ and data_ptr.

A tpu storage is 0 bytes to PyTorch (its data is the JAX array on `storage._tpu`, see `tensor.py`), and
PyTorch resizes PrivateUse1 storages through a C++ hook that Python backends cannot provide. FSDP2 frees an
unsharded parameter by resizing its storage to 0 bytes and allocates it again by resizing it back, under the
same views; `install()` makes these methods work on tpu storages from the `_tpu` buffer:
- `size()`/`nbytes()`: the bytes of the buffer (0 once resized to 0);
- `resize_(n)`: 0 drops the buffer (its memory goes back to JAX); more keeps the leading elements and adds
  unmaterialized ones (`tensor.Uninit`, zeros when read), in the buffer's dtype (n must be a multiple of its size);
  a pending Fused value is computed first (a flush);
- `data_ptr()`: 0, what `Tensor.data_ptr()` of a tpu tensor gives (there is no host-visible address).
CPU and other storages keep PyTorch's methods.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import torch

from tputool.backend import tensor as tt

_installed = False


def _owner(storage: torch.UntypedStorage) -> torch.UntypedStorage:
    """The storage holding `storage`'s buffer: itself, or the one a dtype view's storage sees (`tensor.Reinterpreted`:
    one buffer, as PyTorch's `view(dtype)` keeps one storage)."""
    base = getattr(storage, "_tpu", None)
    return base.parent if type(base) is tt.Reinterpreted else storage


def _buffer(storage: torch.UntypedStorage):
    """The tpu buffer behind `storage`, or None for any other storage."""
    return getattr(_owner(storage), "_tpu", None) if storage.device.type == "tpu" else None


def buffer_nbytes(base) -> int:  # noqa: ANN001 - a jax.Array or tensor.Uninit
    """Bytes of a tpu buffer (a JAX array or an unmaterialized `tensor.Uninit`)."""
    return math.prod(base.shape) * jnp.dtype(base.dtype).itemsize


def resize_buffer(storage: torch.UntypedStorage, nbytes: int) -> None:
    """Resize tpu `storage` to `nbytes` in place (see the module docstring)."""
    base = storage._tpu
    if hasattr(base, "force"):  # a pending Fused value: run its trace first (whose flush would write it back)
        base = storage._tpu = base.force("storage resize_")
    itemsize = jnp.dtype(base.dtype).itemsize
    if nbytes < 0 or nbytes % itemsize:
        raise RuntimeError(f"tpu storage of {base.dtype} elements: resize_({nbytes}) must be a non-negative "
                           f"multiple of {itemsize} bytes")
    n, have = nbytes // itemsize, math.prod(base.shape)
    if n == have and len(base.shape) == 1:
        return
    if n == 0 or type(base) is tt.Uninit:
        storage._tpu = tt.Uninit((n,), base.dtype)
    elif n <= have:
        storage._tpu = base.reshape(-1)[:n]
    else:
        storage._tpu = jnp.pad(base.reshape(-1), (0, n - have))


def install() -> None:
    """Patch `torch.UntypedStorage`'s size, nbytes, resize_ and data_ptr for tpu storages (once)."""
    global _installed
    if _installed:
        return
    cls = torch.UntypedStorage
    nbytes, size, resize_, data_ptr = cls.nbytes, cls.size, cls.resize_, cls.data_ptr

    def _nbytes(self) -> int:
        base = _buffer(self)
        return nbytes(self) if base is None else buffer_nbytes(base)

    def _size(self) -> int:
        base = _buffer(self)
        return size(self) if base is None else buffer_nbytes(base)

    def _resize_(self, size: int):
        if _buffer(self) is None:
            return resize_(self, size)
        resize_buffer(_owner(self), int(size))
        return self

    def _data_ptr(self) -> int:
        return data_ptr(self) if _buffer(self) is None else 0

    cls.nbytes, cls.size, cls.resize_, cls.data_ptr = _nbytes, _size, _resize_, _data_ptr
    _installed = True
