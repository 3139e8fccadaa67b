"""Hand-written tpu kernels for what is not a pure function of JAX values: allocation, copies between
devices, views (aliases of one storage), resize_, set_ and reading a scalar back to the host.
"""

from __future__ import annotations

import functools
import math

import jax
import torch

from tputool.backend import dtypes, events
from tputool.backend import tensor as tt
from tputool.backend.dispatch import LoweredOp, Signature
from tputool.backend.lowerings import Lowering, linalg
from tputool.backend.op_plan import KERNELS
from tputool.backend.runtime import STATE as _state
from tputool.backend.views import contiguous_strides, reinterpret, view_span

aten = torch.ops.aten


def _check_device(device) -> None:
    if device is None:
        return
    d = torch.device(device)
    if d.type == "tpu" and d.index not in (None, 0):
        from tputool.backend.device import device_count
        from tputool.backend.tpu_module import is_own_device

        if is_own_device(d.index):
            return
        if d.index >= device_count():
            raise RuntimeError(f"tpu:{d.index} does not exist: {device_count()} tpu device(s)")
        raise RuntimeError(f"tpu:{d.index}: eager tpu tensors live on tpu:0 in the bundled backend "
                           "(use SPMD sharding across devices, tputool.backend.graph; in a multi-process run, "
                           "the device chosen with torch.tpu.set_device is this process's device)")


def _kernel(*ops):
    def reg(fn):
        for op in ops:
            sig = Signature(op)

            def h(args, kwargs, fn=fn, sig=sig):
                return fn(*sig.normalize(args, kwargs))

            KERNELS[op] = h
        return fn

    return reg


# ---- allocation -----------------------------------------------------------------------------------

@_kernel(aten.empty.memory_format)
def empty(size, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    _check_device(device)
    dtype = dtype or torch.get_default_dtype()
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        stride = torch.empty(size, memory_format=memory_format, device="meta").stride()
        return tt.empty(size, dtype, stride)
    return tt.empty(size, dtype)


@_kernel(aten.empty_strided.default)
def empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_device(device)
    return tt.empty(size, dtype or torch.get_default_dtype(), stride)


@_kernel(aten.resize_.default)
def resize_(self, size, memory_format=None):
    tt.resize(self, size)
    return self


@_kernel(aten.record_stream.default)
def record_stream(self, s):
    """Nothing to record: tpu work runs in order on one stream, and a buffer lives while a tensor holds it."""


# ---- copies -----------------------------------------------------------------------------------------

@functools.cache
def _converter(dst_dtype, dst_shape):
    def conv(x):
        if x.dtype != dst_dtype:
            if jax.numpy.issubdtype(x.dtype, jax.numpy.complexfloating) and not jax.numpy.issubdtype(
                    dst_dtype, jax.numpy.complexfloating):
                x = x.real
            x = x.astype(dst_dtype)
        return jax.numpy.broadcast_to(x, dst_shape)

    return jax.jit(conv)


@functools.cache
def _flip_bits(conj: bool, neg: bool):
    """The jitted map between a tensor's stored values and its values under conjugate / negative view bits
    (each is its own inverse)."""
    def flip(x):
        if conj:
            x = jax.numpy.conj(x)
        return -x if neg else x

    return jax.jit(flip)


def _bits(t: torch.Tensor) -> tuple[bool, bool]:
    """(conjugate bit, negative bit) of `t`: views whose values are the conjugate / negation of their storage's
    (`x.conj()` of a complex tensor, `x.conj().imag`); copies are the ops that must resolve them."""
    return t.is_conj(), t.is_neg()


def _value_for(dst: torch.Tensor, src: torch.Tensor) -> jax.Array:
    """`src`'s value, cast to dst's dtype and broadcast to dst's shape, as a JAX array to store in dst (view
    bits resolved: stored conjugated/negated where dst's bits say so)."""
    v = tt.to_jax(src) if src.device.type == "tpu" else tt.cpu_to_jax(src)
    src_bits, dst_bits = _bits(src), _bits(dst)
    if src_bits != (False, False):
        v = _flip_bits(*src_bits)(v)
        events.launches += 1
    want = dtypes.TORCH_TO_NP[dst.dtype]
    shape = tuple(dst.shape)
    if v.dtype != want or v.shape != shape:
        v = _converter(want, shape)(v)
        events.launches += 1
    if dst_bits != (False, False):
        v = _flip_bits(*dst_bits)(v)
        events.launches += 1
    return v


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """dst.copy_(src) where either side may be the tpu tensor."""
    if dst.device.type == "tpu":
        tt.write(dst, _value_for(dst, src))
        if _state.blocking:
            jax.block_until_ready(dst.untyped_storage()._tpu)
    else:
        v = tt.to_cpu(src, "cpu")
        dst.copy_(v.conj() if src.is_conj() else v)  # (CPU's copy_ resolves the bits of a CPU view)
        if src.is_neg():
            dst.neg_()
    return dst


@_kernel(aten.copy_.default)
def copy_(self, src, non_blocking=False):
    return copy_into(self, src)


@_kernel(aten._copy_from.default)
def _copy_from(self, dst, non_blocking=False):
    return copy_into(dst, self)


@_kernel(aten._copy_from_and_resize.default)
def _copy_from_and_resize(self, dst):
    if tuple(dst.shape) != tuple(self.shape):
        if dst.device.type == "tpu":
            tt.resize(dst, self.shape)
        else:
            dst.resize_(self.shape)
    return copy_into(dst, self)


@_kernel(aten._to_copy.default)
def _to_copy(self, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    dtype = dtype or self.dtype
    target = torch.device(device) if device is not None else self.device
    if target.type == "tpu":
        _check_device(target)
        src = tt.to_jax(self) if self.device.type == "tpu" else tt.cpu_to_jax(self)
        bits = _bits(self)
        if bits != (False, False):
            src = _flip_bits(*bits)(src)
            events.launches += 1
        want = dtypes.to_np(dtype)
        if src.dtype != want:
            src = _converter(want, src.shape)(src)
            events.launches += 1
        return tt.from_jax(src)
    out = tt.to_cpu(self, "cpu")
    if self.is_conj():
        out = out.conj_physical()
    if self.is_neg():
        out = out.neg()
    if memory_format in (None, torch.preserve_format):
        if not self.is_contiguous() and _dense(self):  # (PyTorch keeps such strides)
            out = torch.empty_strided(self.size(), self.stride(), dtype=out.dtype).copy_(out)
    elif memory_format is not torch.contiguous_format:
        out = out.contiguous(memory_format=memory_format)
    if target.type != "cpu" or out.dtype != dtype:
        out = out.to(device=target, dtype=dtype)
    return out


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense (torch._prims_common's test, imported late: torch imports the backend)."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false

    return is_non_overlapping_and_dense_or_false(t)


_BIT_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.Conjugate) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.Negative)


def clone_resolving_bits(self, *, memory_format=None):
    """aten.clone at the Conjugate/Negative dispatch keys, which only tensors with a view bit reach: a tpu
    tensor's clone holds its values with the bits resolved (CPU's clone copies through copy_, which resolves
    them; `.cpu()` of `x.conj()` clones first); other tensors go on as usual."""
    conj, neg = self.is_conj(), self.is_neg()
    with torch._C._ExcludeDispatchKeyGuard(_BIT_KEYS):  # (ops below dispatch as usual: Fused mode records them)
        out = aten.clone.default(self, memory_format=memory_format)
        if self.device.type == "tpu":  # our clone copied the stored values; resolve them
            if conj:
                out = aten.conj_physical.default(out)
            if neg:
                out = aten.neg.default(out)
    return out


def _resolved(x):
    if isinstance(x, torch.Tensor) and x.device.type == "tpu" and (x.is_conj() or x.is_neg()):
        return x.clone()  # (clone_resolving_bits)
    return x


def _resolving(op: torch._ops.OpOverload):
    """A kernel for `op` at the Conjugate/Negative keys, where PyTorch lets it through with the bits set (its
    CPU/CUDA kernels read them, e.g. BLAS conjugate-transposes `x.mH @ y`): tpu inputs with a bit are resolved
    into plain tensors first, since lowerings see stored values only; other tensors go on as usual."""
    def kernel(*args, **kwargs):
        args = [_resolved(a) for a in args]
        kwargs = {k: (v if k == "out" else _resolved(v)) for k, v in kwargs.items()}
        with torch._C._ExcludeDispatchKeyGuard(_BIT_KEYS):
            return op(*args, **kwargs)

    return kernel


BIT_KERNELS = {"clone": clone_resolving_bits}
"""aten op name -> kernel registered at the Conjugate and Negative keys (see clone_resolving_bits)."""
for _name in ("mm", "bmm", "addmm", "baddbmm", "dot", "vdot", "linalg_solve_triangular", "conj_physical",
              "mm.out", "bmm.out", "addmm.out", "baddbmm.out", "dot.out", "vdot.out", "linalg_solve_triangular.out"):
    _pkt, _, _ov = _name.partition(".")
    BIT_KERNELS[_name] = _resolving(getattr(getattr(aten, _pkt), _ov or "default"))


@_kernel(aten._local_scalar_dense.default)
def _local_scalar_dense(self):
    return tt.to_cpu(self, "item").item()


# ---- views: new TensorImpls sharing the storage ---------------------------------------------------

_META_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.Meta)


@_kernel(aten.as_strided.default)
def as_strided(self, size, stride, storage_offset=None):
    return tt.alias(self, size, stride, storage_offset)


@_kernel(aten.as_strided_.default)
def as_strided_(self, size, stride, storage_offset=None):
    off = self.storage_offset() if storage_offset is None else storage_offset
    aten.set_.source_Storage_storage_offset.redispatch(_META_KS, self, self.untyped_storage(), off, size, stride)
    return self


def _infer_size(size, numel: int) -> list[int]:
    size = list(size)
    if -1 in size:
        i = size.index(-1)
        rest = math.prod(s for j, s in enumerate(size) if j != i)
        size[i] = numel // rest if rest else 0
    if math.prod(size) != numel:
        raise RuntimeError(f"shape '{list(size)}' is invalid for input of size {numel}")
    return size


@_kernel(aten.view.default)
def view(self, size):
    size = _infer_size(size, self.numel())
    if self.is_contiguous():
        return tt.alias(self, size, contiguous_strides(size))
    meta = torch.empty_strided(self.shape, self.stride(), dtype=self.dtype, device="meta")
    return tt.alias(self, size, meta.view(size).stride())


@_kernel(aten._reshape_alias.default)
def _reshape_alias(self, size, stride):
    return tt.alias(self, size, stride)


@_kernel(aten.unfold.default)
def unfold(self, dimension, size, step):
    d = dimension % max(self.dim(), 1)
    if self.dim() == 0:
        return tt.alias(self, [size], [1])
    shape, stride = list(self.shape), list(self.stride())
    n = (shape[d] - size) // step + 1
    new_shape = shape[:d] + [n] + shape[d + 1:] + [size]
    new_stride = stride[:d] + [stride[d] * step] + stride[d + 1:] + [stride[d]]
    return tt.alias(self, new_shape, new_stride)


def _meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with `t`'s dtype and geometry (size, stride, storage offset): PyTorch's own view kernels run
    on it to give a view's geometry, with PyTorch's checks and errors."""
    span = t.storage_offset() + view_span(tuple(t.shape), t.stride())
    return torch.empty(max(span, 1), dtype=t.dtype, device="meta").as_strided(t.shape, t.stride(), t.storage_offset())


def _dtype_view(t: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """The tpu view of `t` whose dtype and geometry are meta tensor `view`'s (one buffer, as in PyTorch)."""
    return tt.dtype_alias(t, view.dtype, tuple(view.shape), view.stride(), view.storage_offset())


@_kernel(aten.view.dtype)
def view_dtype(self, dtype):
    return _dtype_view(self, aten.view.dtype(_meta_like(self), dtype))


@_kernel(aten.view_as_real.default)
def view_as_real(self):
    if self.is_conj():
        raise RuntimeError("view_as_real doesn't work on unresolved conjugated tensors.  To resolve the conjugate "
                           "tensor so you can view it as real, use self.resolve_conj()")
    return _dtype_view(self, aten.view_as_real.default(_meta_like(self)))


@_kernel(aten.view_as_complex.default)
def view_as_complex(self):
    return _dtype_view(self, aten.view_as_complex.default(_meta_like(self)))


@_kernel(aten.set_.source_Storage_storage_offset)
def set_storage(self, source, storage_offset, size, stride=()):
    want = dtypes.to_np(self.dtype)
    if not hasattr(source, "_tpu"):
        nbytes = source.nbytes()
        source._tpu = tt.Uninit((nbytes // self.element_size(),), want)
    elif type(source._tpu) is not tt.Uninit and source._tpu.dtype != want and source._tpu.dtype == jax.numpy.uint8:
        # raw bytes (a storage restored by torch.load(map_location="tpu")): reinterpret as this dtype
        raw = source._tpu.reshape(-1)
        raw = raw[: raw.shape[0] // want.itemsize * want.itemsize]
        source._tpu = reinterpret(raw, want)
    stride = stride or contiguous_strides(size)
    aten.set_.source_Storage_storage_offset.redispatch(_META_KS, self, source, storage_offset, size, stride)
    return self


@_kernel(aten.set_.source_Storage)
def set_storage_full(self, source):
    n = source.nbytes() // self.element_size()
    return set_storage(self, source, 0, [n], [1])


@_kernel(aten.set_.source_Tensor)
def set_tensor(self, source):
    aten.set_.source_Storage_storage_offset.redispatch(_META_KS, self, source.untyped_storage(),
                                                       source.storage_offset(), source.shape, source.stride())
    return self


@_kernel(aten.set_.default)
def set_empty(self):
    fresh = tt.empty((0,), self.dtype)
    return set_tensor(self, fresh)


# Ops registered directly with torch.library (cheaper than the boxed fallback; and for structured ops such as
# _linalg_det, the only way their functional form reaches the device: else PyTorch calls the out= form); the
# rest of KERNELS is reached through the fallback.
HOT = (aten.view.dtype, aten.index.Tensor, aten.index_put_.default, aten._index_put_impl_.default, aten.empty.memory_format, aten.empty_strided.default, aten.copy_.default, aten._copy_from.default,
       aten._to_copy.default, aten.as_strided.default, aten.as_strided_.default, aten.view.default, aten._reshape_alias.default,
       aten._local_scalar_dense.default, aten.resize_.default, aten._linalg_det.default, aten._linalg_slogdet.default)


# ---- data-dependent shapes: one scalar host sync for the size, then the work on the device --------

HOST_MAX_ELEMENTS = 1 << 16
"""Up to this many elements in its tensors, a data-dependent op (nonzero, masked_select, indexing by a boolean
mask) runs on the host: it syncs the host for its size anyway, and on the device each new input shape and each
new result size compiles a program (a decoder's `tokens[tokens >= k]`, one token longer each step, compiled two
programs a token). The copies are small; PyTorch's CPU kernel gives the result and any error."""


def _small(*tensors) -> bool:
    if _state.abstract is not None:  # (compile-only devices: no data to copy)
        return False
    n = 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            n += t.numel()
        elif isinstance(t, list | tuple):
            n += sum(i.numel() for i in t if i is not None)
    return n <= HOST_MAX_ELEMENTS


def _on_host(op, *args):
    """`op` on CPU copies of its tpu tensors (one host sync, counted once), its result moved back to the device."""
    synced = []

    def to_cpu(x):
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            synced.append(x)
            return tt.jax_to_cpu(tt.to_jax(x), "nonzero", count=len(synced) == 1)
        if isinstance(x, list | tuple):
            return type(x)(to_cpu(i) for i in x)
        return x

    out = op(*(to_cpu(a) for a in args))
    return tt.from_jax(tt.cpu_to_jax(out))

@functools.cache
def _count_fn():
    return jax.jit(lambda m: jax.numpy.count_nonzero(m))


@functools.cache
def _nonzero_fn(n: int):
    return jax.jit(lambda a: jax.numpy.stack(jax.numpy.nonzero(a, size=n), axis=1).astype(jax.numpy.int64))


@functools.cache
def _masked_select_fn(n: int):
    def f(a, m):
        a, m = jax.numpy.broadcast_arrays(a, m)
        return a.reshape(-1)[jax.numpy.nonzero(m.reshape(-1), size=n)]

    return jax.jit(f)


def _count(m: jax.Array) -> int:
    events.launches += 1
    return int(tt.jax_to_cpu(_count_fn()(m), "nonzero").item())


@_kernel(aten.nonzero.default)
def nonzero(self):
    if _small(self):
        return _on_host(aten.nonzero.default, self)
    a = tt.to_jax(self)
    events.launches += 1
    if a.ndim == 0:
        a = a.reshape(1)
        events.launches += 2  # (the reshape and the slice)
        return tt.from_jax(_nonzero_fn(_count(a))(a)[:, :0])
    return tt.from_jax(_nonzero_fn(_count(a))(a))


@_kernel(aten.masked_select.default)
def masked_select(self, mask):
    if self.device.type != mask.device.type:
        raise tt.mixed_devices()
    if _small(self, mask):
        return _on_host(aten.masked_select.default, self, mask)
    a, m = tt.to_jax(self), tt.to_jax(mask).astype(bool)
    n = _count(jax.numpy.broadcast_to(m, jax.numpy.broadcast_shapes(a.shape, m.shape)))
    events.launches += 3  # (the cast, the broadcast and the selection)
    return tt.from_jax(_masked_select_fn(n)(a, m))


def _expand_masks(indices) -> list:
    """Boolean/uint8 mask indices replaced by their nonzero() coordinates (one index per mask dim)."""
    out = []
    for i in indices:
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            nz = nonzero(i) if i.device.type == "tpu" else i.nonzero()  # (CPU coordinates move with the index)
            out.extend(nz.unbind(1) if i.dim() else [])
        else:
            out.append(i)
    return out


def _has_mask(indices) -> bool:
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


def _lowered(op):
    from tputool.backend.dispatch import LoweredOp
    from tputool.backend.op_plan import eager_lowering

    return LoweredOp(op, eager_lowering(op))


_det_h: dict = {}


def _det_like(op, fn, A):
    # Reads A's layout, so a kernel: `fn` returns the LU factors of A^T for a real A, which PyTorch's det/slogdet
    # backward expects when A is contiguous; a non-contiguous real A goes in transposed (same determinant), so
    # the factors are A's, as the backward then expects. (Eager only: traced executors cannot see layouts.)
    h = _det_h.get(op) or _det_h.setdefault(op, LoweredOp(op, Lowering(fn)))
    if not A.is_contiguous() and not A.is_complex():
        A = A.mT
    return h((A,), {})


@_kernel(aten._linalg_det.default)
def _linalg_det(A):
    return _det_like(aten._linalg_det.default, linalg.det, A)


@_kernel(aten._linalg_slogdet.default)
def _linalg_slogdet(A):
    return _det_like(aten._linalg_slogdet.default, linalg.slogdet, A)


_index_h = None


@_kernel(aten.index.Tensor)
def index(self, indices):
    global _index_h
    if _index_h is None:
        _index_h = _lowered(aten.index.Tensor)
    if _has_mask(indices):
        if self.device.type == "tpu" and _small(self, indices):  # (CPU indices into tpu: allowed, as on CUDA)
            return _on_host(aten.index.Tensor, self, indices)
        if any(i is not None and i.dim() == 0 for i in indices):
            from tputool.backend import fallback

            return fallback.run_on_cpu(aten.index.Tensor, (self, indices), {})
        indices = _expand_masks(indices)
    return _index_h((self, indices), {})


def _index_put_inplace(self, indices, values, accumulate=False, unsafe=False):
    if any(i is not None and i.dim() == 0 and i.dtype in (torch.bool, torch.uint8) for i in indices):
        from tputool.backend import fallback

        return fallback.run_on_cpu(aten.index_put_.default, (self, indices, values, accumulate), {})
    if _has_mask(indices) and not (len(indices) == 1 and values.numel() == 1 and not accumulate):
        indices = _expand_masks(indices)
    out = aten.index_put.default(self, indices, values, accumulate)
    tt.write(self, tt.to_jax(out))
    return self


_index_put_h = None


def _index_put(self, indices, values, accumulate=False):
    """Functional index_put (a backward of `x[mask]`): boolean masks become their coordinates first, so the
    lowering runs on the device (it cannot trace data-dependent positions; this op ran on the CPU whole)."""
    global _index_put_h
    if _index_put_h is None:
        _index_put_h = _lowered(aten.index_put.default)
    if _has_mask(indices) and not (len(indices) == 1 and values.numel() == 1 and not accumulate):
        if any(i is not None and i.dim() == 0 and i.dtype in (torch.bool, torch.uint8) for i in indices):
            from tputool.backend import fallback

            return fallback.run_on_cpu(aten.index_put.default, (self, indices, values, accumulate), {})
        indices = _expand_masks(indices)
    return _index_put_h((self, indices, values, accumulate), {})


KERNELS[aten.index_put.default] = lambda args, kwargs: _index_put(*args, **kwargs)
KERNELS[aten.index_put_.default] = lambda args, kwargs: _index_put_inplace(*args, **kwargs)
KERNELS[aten._index_put_impl_.default] = lambda args, kwargs: _index_put_inplace(*args, **kwargs)


# ---- batch norm: PyTorch's decomposition, with CPU's empty saved statistics in eval mode ----------

def _batch_norm_handler(op):
    from tputool.backend.op_plan import decomposition

    decomp = decomposition(op)
    sig = Signature(op)

    def h(args, kwargs):
        vals = sig.normalize(args, kwargs)
        out = decomp(*args, **kwargs)
        if not vals[5]:  # training
            empty_stats = tt.empty((0,), out[1].dtype)
            return (out[0], empty_stats, tt.empty((0,), out[2].dtype)) + tuple(out[3:])
        return out

    return h


for _op in (aten.native_batch_norm.default, aten._native_batch_norm_legit.default):
    KERNELS[_op] = _batch_norm_handler(_op)
