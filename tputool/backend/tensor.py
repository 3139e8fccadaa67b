"""tpu tensors and their JAX values.

A tpu tensor is a PrivateUse1 TensorImpl with a 0-byte storage. The data lives on the storage's Python
object as `_tpu`: the base buffer, a JAX array in the shape of the tensor that allocated it (or an
`Uninit` placeholder until first written). Views are separate TensorImpls sharing that storage, with their
own (size, stride, storage_offset); `to_jax` reads the base through them and `write` scatters into it,
so `x[0].add_(1)` updates `x` as in PyTorch.

Public API (used by the graph-mode helper too): `to_jax`, `from_jax`, `write`, `alias`, `empty`.
"""

from __future__ import annotations

import math
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tputool.backend import dtypes, events, memory, views
from tputool.backend.asserts import raise_pending
from tputool.backend.runtime import STATE

_create = torch._C._acc.create_empty_tensor
_META_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset
_set_storage_meta = _set_storage._handle.redispatch_boxed
"""set_(storage, offset, size, stride) run by the Meta kernel: (keyset, tensor, storage, offset, size, stride).
(The OpOverload's own .redispatch adds a Python layer; this runs once per view.)"""


_pending: list[weakref.ref] = STATE.in_flight
"""Weak references to arrays produced since the last `synchronize()` (what it has to wait for)."""


def track(a: jax.Array) -> None:
    """Remember `a` as in flight; past 4096 entries, wait for the older half (bounds the list)."""
    if STATE.abstract is not None:
        return  # (tracers of the abstract run: nothing runs)
    _pending.append(weakref.ref(a))
    if len(_pending) > 4096:
        old = _pending[:2048]
        del _pending[:2048]
        for r in old:
            x = r()
            if x is not None:
                x.block_until_ready()


def synchronize() -> None:
    """Wait for every tracked array still alive; raise a device-side assert that failed meanwhile."""
    if STATE.assert_sites or STATE.asserts or STATE.assert_failure:
        raise_pending()
    if STATE.abstract is not None:
        return
    refs = list(_pending)
    _pending.clear()
    for r in refs:
        x = r()
        if x is not None:
            x.block_until_ready()


class Uninit:
    """Base buffer of a tensor made by `empty`: materialized as zeros when first read. Its bytes count as
    allocated from the start, as CUDA's allocator counts them (`live_bytes`, read by `memory.allocated`)."""

    __slots__ = ("shape", "dtype", "nbytes")
    live_bytes = 0
    """Bytes of the placeholders alive now (each adds its bytes when made, takes them back when dropped)."""

    def __init__(self, shape: tuple, dtype: np.dtype) -> None:
        self.shape = shape
        self.dtype = dtype
        self.nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        Uninit.live_bytes += self.nbytes

    def __del__(self) -> None:
        Uninit.live_bytes -= self.nbytes

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class Reinterpreted:
    """The buffer of a dtype view (`view(dtype)`, `view_as_real`, `view_as_complex`): another storage's buffer
    seen as `dtype`, flat. Reads and writes go through to that storage, so a view and what it views stay one
    buffer as in PyTorch (`c.real.mul_(2)` changes `c`). Its `shape` is None, never a tensor's: the inline
    paths that return a storage's buffer whole fall through to `to_jax` and `write`, which see through it."""

    __slots__ = ("parent", "dtype")
    shape = None

    def __init__(self, parent, dtype: np.dtype) -> None:
        self.parent, self.dtype = parent, dtype

    def read(self) -> jax.Array:
        """The parent's buffer as a flat array of this dtype (a pending Fused value is computed first)."""
        base = self.parent._tpu
        if hasattr(base, "force"):  # (a Fused mode `Lazy`)
            base = self.parent._tpu = base.force("dtype view")
        elif type(base) is Uninit:
            base = _base(self.parent)
        events.launches += 1
        return views.reinterpret(base.reshape(-1), self.dtype)

    def store(self, flat: jax.Array) -> None:
        """Make `flat` (this dtype) the parent's buffer, in the parent's own dtype and shape."""
        base = self.parent._tpu
        if hasattr(base, "force"):
            base = base.force("dtype view")
        events.launches += 1
        self.parent._tpu = new = views.reinterpret(flat, np.dtype(base.dtype)).reshape(base.shape)
        track(new)


def _base(storage) -> jax.Array:
    base = storage._tpu
    if type(base) is Uninit:
        base = storage._tpu = jnp.zeros(base.shape, base.dtype)
        events.launches += 1
    return base


def from_jax(a: jax.Array, requires_grad: bool = False) -> torch.Tensor:
    """A new contiguous tpu tensor holding `a` (its shape and dtype)."""
    t = _create(a.shape, dtypes.NP_TO_TORCH[a.dtype])
    t.untyped_storage()._tpu = a
    if requires_grad:
        t.requires_grad_(True)
    return t


def empty(size, dtype: torch.dtype, stride=None) -> torch.Tensor:
    """A new tpu tensor of `size` (and `stride`, if given) whose data is not yet materialized."""
    size = tuple(size)
    npdt = dtypes.to_np(dtype)
    nbytes = math.prod(size) * dtype.itemsize
    if nbytes >= memory.CHECK_FROM and STATE.abstract is None:  # (a large request: refused now if it cannot fit, as CUDA's allocator does)
        memory.check_alloc(nbytes)
    t = _create(size, dtype)
    if stride is not None and tuple(stride) != t.stride() and math.prod(size) > 1:
        t.untyped_storage()._tpu = Uninit((views.view_span(size, tuple(stride)),), npdt)
        _set_storage_meta(_META_KS, t, t.untyped_storage(), 0, size, stride)
    else:
        t.untyped_storage()._tpu = Uninit(size, npdt)
    return t


_inference_mode_on = torch.is_inference_mode_enabled
_InferenceMode = torch._C._InferenceMode


def _view_shell(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """An empty tensor to become a view of `t`: an inference tensor exactly when `t` is one, as CPU's views are (a
    view of a normal tensor taken under `torch.inference_mode()` is normal: autograd then shares `t`'s version
    counter with it, which an inference tensor refuses: "Cannot set version_counter for inference tensor")."""
    inference = t.is_inference()
    if _inference_mode_on() is inference:
        return _create((0,), dtype)
    with _InferenceMode(inference):
        return _create((0,), dtype)


def alias(t: torch.Tensor, size, stride, offset: int | None = None) -> torch.Tensor:
    """A new tensor sharing `t`'s storage, seen through (size, stride, offset) — a true view."""
    v = _view_shell(t, t.dtype)
    _set_storage_meta(_META_KS, v, t.untyped_storage(), t.storage_offset() if offset is None else offset, size, stride)
    if t.is_conj():  # (a view keeps the conjugate/negative bits of what it views, as CPU's views do)
        torch._C._set_conj(v, True)
    if t.is_neg():
        torch._C._set_neg(v, True)
    return v


def dtype_alias(t: torch.Tensor, dtype: torch.dtype, size, stride, offset: int) -> torch.Tensor:
    """A view of `t`'s buffer as `dtype`, seen through (size, stride, offset) in `dtype`'s elements: a tensor on
    the buffer's own storage where that storage holds `dtype`, else on a storage of its own whose buffer is
    `Reinterpreted` (PyTorch's `view(dtype)` keeps one storage; the buffers here hold one dtype each)."""
    st = t.untyped_storage()
    base = st._tpu
    parent = base.parent if type(base) is Reinterpreted else st
    v = _create((0,), dtype)  # (made in the current mode, as CPU's `view(dtype)`: under inference_mode() an inference tensor)
    if np.dtype(parent._tpu.dtype) == dtypes.to_np(dtype):
        _set_storage_meta(_META_KS, v, parent, offset, size, stride)
        return v
    own = v.untyped_storage()
    own._tpu = Reinterpreted(parent, dtypes.to_np(dtype))
    _set_storage_meta(_META_KS, v, own, offset, size, stride)
    return v


def has_data(t: torch.Tensor) -> bool:
    """True for a tpu tensor made by this backend (not a fake/meta tensor on the tpu device)."""
    return t.layout is torch.strided and hasattr(t.untyped_storage(), "_tpu")  # (sparse: no storage of its own)


def to_jax(t: torch.Tensor) -> jax.Array:
    """The JAX value of tpu tensor `t`, honoring its view (size, stride, storage offset)."""
    st = t.untyped_storage()
    base = st._tpu
    shape = t.shape
    if shape == base.shape and type(base) is not Uninit and t.storage_offset() == 0 and t.is_contiguous():
        return base
    if type(base) is Uninit:
        base = _base(st)
    elif type(base) is Reinterpreted:
        base = base.read()
    size, stride, off = tuple(shape), t.stride(), t.storage_offset()
    events.launches += 1  # (a reshape of a whole buffer, or a view's read kernel)
    if off == 0 and math.prod(size) == base.size and views.is_contiguous(size, stride):
        return base.reshape(size)
    return views.read(base, size, stride, off)


def write(t: torch.Tensor, value: jax.Array) -> None:
    """Store `value` (shape and dtype of `t`) into tpu tensor `t`, through its view."""
    st = t.untyped_storage()
    base = st._tpu
    off = t.storage_offset()
    size = tuple(t.shape)
    if type(base) is Reinterpreted:  # (a dtype view: written into the buffer it views)
        flat = base.read()
        base.store(views.write(flat, value, size, t.stride(), off) if off or not t.is_contiguous()
                   or math.prod(size) != flat.size else value.reshape(-1))
        return
    if off == 0 and t.is_contiguous():
        if value.shape == base.shape:  # the whole buffer, same shape (what compiled graphs write back)
            st._tpu = value
            return
        if math.prod(size) == base.size:  # the whole buffer, seen in another shape
            st._tpu = value.reshape(base.shape)
            events.launches += 1
            return
    if type(base) is Uninit:
        base = _base(st)
    st._tpu = new = views.write(base, value, size, t.stride(), off)
    events.launches += 1
    track(new)


def resize(t: torch.Tensor, size) -> None:
    """Resize `t` in place to contiguous `size`, keeping the leading data (PyTorch's resize_)."""
    size = tuple(size)
    stride = tuple(int(math.prod(size[i + 1:])) for i in range(len(size)))
    st = t.untyped_storage()
    base = st._tpu
    need = t.storage_offset() + math.prod(size)
    if need > base.size:
        if type(base) is Uninit:
            st._tpu = Uninit((need,), base.dtype)
        else:
            st._tpu = jnp.pad(base.reshape(-1), (0, need - base.size))
            events.launches += 2
    _set_storage_meta(_META_KS, t, st, t.storage_offset(), size, stride)


# ---- host <-> device ----------------------------------------------------------------------------

class MixedDevices(RuntimeError):
    """A tpu op got a CPU tensor with elements among its operands (PyTorch's error on CUDA, same words)."""


def mixed_devices(other: torch.device | str = "cpu") -> MixedDevices:
    """The error PyTorch raises on CUDA when an op mixes devices, worded for tpu."""
    return MixedDevices("Expected all tensors to be on the same device, but found at least two devices, "
                        f"tpu:0 and {other}!")


def host_operand(t: torch.Tensor) -> jax.Array:
    """The JAX value of CPU tensor `t` as an operand of a tpu op: only a 0-dim tensor (a scalar) may mix
    with tpu tensors, as on CUDA; any other raises `MixedDevices` instead of copying it to the device."""
    if t.dim() == 0:
        return cpu_to_jax(t)
    raise mixed_devices(t.device)


def cpu_to_jax(t: torch.Tensor, device: jax.Device | None = None, count: bool = True) -> jax.Array:
    """A JAX array with the values of CPU tensor `t`; `count`: record the transfer event (compiled graphs'
    constants and CPU scalar inputs are not counted)."""
    t = t.detach()
    if t._is_zerotensor():
        return jnp.zeros(tuple(t.shape), dtypes.to_np(t.dtype))
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    via = dtypes.BITCAST_VIA.get(t.dtype)
    if via is not None:
        arr = t.view(via[0]).numpy().view(dtypes.TORCH_TO_NP[t.dtype])
    else:
        arr = t.numpy()
    # A copy that nothing else writes: JAX reads a host array when its transfer reaches the front of the
    # device's queue, after the computations dispatched before it; `t`'s own memory may be written by then
    # (a 0-d hyperparameter tensor refilled for the next call, a staging buffer refilled for the next batch).
    arr = arr.copy()
    if count:
        events.record("transfer_h2d", "", arr.nbytes)
    if STATE.abstract is not None:
        return STATE.abstract.from_host(arr)
    return jax.device_put(arr, device) if device is not None else jnp.asarray(arr)


def jax_to_cpu(a: jax.Array, reason: str = "cpu", count: bool = True) -> torch.Tensor:
    """A CPU tensor with the values of JAX array `a` (a host sync, counted as one unless not `count`); raises a
    device-side assert that failed since the last sync point (`tputool.backend.asserts`)."""
    if STATE.assert_sites or STATE.asserts or STATE.assert_failure:
        raise_pending()
    arr = np.asarray(a) if STATE.abstract is None else STATE.abstract.read(a, reason)
    if count:
        events.record("host_sync", reason)
        events.record("transfer_d2h", "", arr.nbytes)
    tdt = dtypes.to_torch(arr.dtype)
    via = dtypes.BITCAST_VIA.get(tdt)
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.array(arr)
    if via is not None:
        return torch.from_numpy(arr.view(via[1])).view(tdt)
    return torch.from_numpy(arr)


def to_cpu(t: torch.Tensor, reason: str = "cpu") -> torch.Tensor:
    """A CPU tensor with the values of tpu tensor `t` (same shape, contiguous)."""
    return jax_to_cpu(to_jax(t), reason)
