"""Fused eager mode (torch.tpu.EagerMode.DEFER_AND_FUSE): ops on tpu tensors are deferred and run as one
compiled computation at the next sync point.

A TorchDispatchMode (pushed while the mode is on) sees every op. An op with a lowering is recorded as a
node; its outputs are tpu tensors whose storage holds a `Lazy` value instead of a JAX array. In-place ops
record their functional twin plus a write into the target's storage (through its view); view ops and
allocations run as usual (they only touch metadata). Anything else that reads a lazy tensor (`.item()`,
`.cpu()`, printing, `bool()` on a value, an op without a lowering) first flushes: the recorded nodes become
one `jax.jit` function over the concrete inputs, returning every value still alive, cached in the shared
per-op cache (`tputool.backend.cache`) under the trace's structure (ops, wiring, shapes/dtypes), so
repeated steps reuse the compiled computation. Every `Optimizer.step` ends with a flush. Each flush is a
"flush" event whose detail is its reason. An op whose recording fails is rolled back out of the trace and
run eagerly after a flush (reason "... (could not defer: ...)"): the mode never raises from recording,
because an exception from a dispatch mode on autograd's tpu worker thread aborts the process.
"""

from __future__ import annotations

import functools
import gc
import math
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor as _FunctionalTensor
from torch.utils._python_dispatch import TorchDispatchMode, _pop_mode, _push_mode

from tputool.backend import (
    asserts,
    cache,
    events,
    executables,
    fused_cut,
    fused_disk,
    memory,
    op_plan,
    rng,
    runtime,
)
from tputool.backend import tensor as tt
from tputool.backend.graph import persistent_cache
from tputool.backend.lowerings import on_change as _on_lowerings_change
from tputool.backend.lowerings.checks import run_checked
from tputool.backend.view_geometry import GEOMETRY

aten = torch.ops.aten
META_SHAPES = True
"""A new trace's op nodes take their output shapes from PyTorch's meta kernels (False: abstract evaluation of
each lowering, ~1 ms per new node)."""
MAX_NODES = 4000
"""A trace longer than this is flushed (reason "size") to bound compile times; a loop that grows one is cut at
the step it repeats from then on (`fused_cut`)."""
CHURN_SEEN = 2
"""An op recorded with new shapes where the same op already had this many other ones (at the same place in a
trace: after the same recorded prefix) runs alone instead, after a flush of the prefix, and the trace goes on
after it: a sequence that grows by one token each step then costs a small program per length (its concatenation
and the read of its tail), not a new fused program of the whole step per length. A trace's first op, whose
place every trace of the process shares, counts only the new shapes it met in recent traces (ROOT_WINDOW)."""
CHURN_RETRY_MAX = 16
"""After two flushes in a row that followed ops run alone still compiled new programs (every shape of the step is
new: a sequence still shorter than the model's block), no op runs alone for 4, then this many traces,
then it is tried again (running alone pays once the step after the growing ops repeats; until then it only adds
small programs)."""
ROOT_WINDOW = 4
"""A trace's first op with new shapes runs alone when the same op also began a trace with new shapes in each of
the last CHURN_SEEN times, each within this many traces of the one before (a loop whose every step starts with
the growing op, e.g. after a sampling op that syncs); older first ops (another model, another test) do not
count."""
CHURN_BUDGET = 4
"""Ops run alone that way in a row, at most, until an op is recorded as before or a trace is flushed (a step
whose every shape is new, e.g. a new batch size throughout, then runs its first few ops alone and fuses the
rest)."""

PASSTHROUGH = {aten.empty.memory_format, aten.empty_strided.default, aten.detach.default, aten.alias.default,
               aten.lift_fresh.default}
"""Ops that only make or relabel tensors: run as usual even on lazy tensors."""

SYNC_REASONS = {
    aten._local_scalar_dense.default: ".item() / bool() / a Python number from a tensor",
    aten._to_copy.default: "copy to another device (.cpu(), .to())",
    aten.copy_.default: "copy between devices",
    aten.equal.default: "torch.equal",
    aten.nonzero.default: "data-dependent shape (nonzero)",
    aten.masked_select.default: "data-dependent shape (masked_select)",
}
"""Flush reasons for the usual sync points; other flushes name the op that needed concrete data."""


class Lazy:
    """The pending value of a tpu storage: output `index` of node `node` of the current trace."""

    __slots__ = ("trace", "node", "index", "shape", "dtype", "value", "__weakref__")

    def __init__(self, trace: Trace, node: int, index: int | None, shape: tuple, dtype: Any) -> None:
        self.trace, self.node, self.index, self.shape, self.dtype, self.value = trace, node, index, shape, dtype, None

    @property
    def size(self) -> int:
        """Number of elements (as jax.Array.size)."""
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        """Rank (as jax.Array.ndim)."""
        return len(self.shape)

    def force(self, reason: str = "read") -> jax.Array:
        """The concrete value, flushing the trace if needed."""
        if self.value is None:
            self.trace.flush(reason)
        return self.value

    def __array__(self, dtype=None, copy=None):  # noqa: ANN001 - numpy protocol
        return np.asarray(self.force("host read"), dtype=dtype)


def _static(v: Any) -> Any:
    if isinstance(v, list | tuple):
        return tuple(_static(x) for x in v)
    if isinstance(v, float) and v != v:
        return ("nan",)
    if type(v) in (int, float, bool):
        return (type(v), v)  # (1, 1.0 and True are equal keys otherwise)
    return v


class _Step:
    """A node of the trie of recorded traces: the node descriptions seen after this prefix (desc -> next
    step), the output shapes of the node that led here, and the fused functions compiled for a trace ending
    here (live outputs -> jitted function). A description holds the op, its static arguments, and for each
    input either the producing node or the external input's index and shape/dtype (type for numbers), so a
    path through the trie determines every shape of the trace and the whole fused computation."""

    __slots__ = ("kids", "shapes", "compiled", "key")

    def __init__(self, shapes: Any, key: str | None = None) -> None:
        self.kids: dict = {}
        self.shapes = shapes
        self.compiled: dict = {}
        self.key = key
        """The node's key in the disk cache (`tputool.backend.fused_disk`), None where it is not kept."""


_ROOT = _Step(None)


class Trace:
    """Nodes recorded since the last flush, their concrete inputs, and every Lazy they produced."""

    def __init__(self) -> None:
        self._gc_paused = False
        self.churn_left = CHURN_BUDGET  # ops that may still run alone in a row (CHURN_BUDGET; refilled by reset)
        self.serial = 0  # traces begun (one per reset)
        self.root_new: dict = {}  # op head -> (serial, streak) of the last trace it began with new shapes
        self.churn_wait = 0  # no op runs alone before this serial (CHURN_RETRY_MAX)
        self.churn_fails = 0  # traces in a row whose ops run alone saved no compile
        self.churn_ran = False  # an op ran alone since the last flush
        self.churn_tried = False  # the last flush after ops run alone compiled a new program
        self.cutter = fused_cut.Cutter(MAX_NODES)  # where a trace growing without a sync point is cut
        self.reset()

    def reset(self) -> None:
        """Forget everything recorded."""
        self._resume_gc()
        self.serial += 1
        self.churn_left = CHURN_BUDGET
        self.nodes: list[tuple[Callable, tuple, dict]] = []
        self.step: _Step = _ROOT
        self.ext: list = []
        self.ext_index: dict[int, int] = {}
        self.ext_refs: list[tuple] = []
        self.lazies: list[weakref.ref] = []
        # Storages given a Lazy since the last flush (weakly: a Lazy that nothing but a dead or overwritten
        # storage held must not become an output of the fused computation).
        self.storages: list[weakref.ref] = []
        self._node_shapes: list = []
        self.undo: list[tuple[Any, Any]] = []  # (storage, its value before a recorded write)
        self.rng_undo: list[tuple[Any, int]] = []  # (random stream, its counter before a recorded draw)
        self.checks: list[tuple[int, str, str]] = []  # (node, op, user's file:line) of each checked op recorded
        self.churned = False  # an op being recorded met shapes that keep changing at its place (CHURN_SEEN)
        self.limit = self.cutter.limit()  # the trace length at which `at_limit` is asked (after an op)

    def _pause_gc(self) -> None:
        # While a trace records, the cyclic collector only moves its nodes and pending values (which die
        # at the flush, freed by reference counting) into older generations, and each full collection then
        # rescans the whole heap (~130 ms with a compiled model's objects alive). Paused until the flush:
        # at most MAX_NODES ops; a collector the program had disabled stays off.
        if gc.isenabled():
            gc.disable()
            self._gc_paused = True

    def _resume_gc(self) -> None:
        if self._gc_paused:
            self._gc_paused = False
            gc.enable()

    def mark(self) -> tuple:
        """The trace's current length, for `rollback`."""
        return (len(self.nodes), len(self.ext), len(self.lazies), len(self.storages), len(self.undo), self.step,
                len(self.checks), len(self.rng_undo))

    def rollback(self, mark: tuple) -> None:
        """Forget what was recorded since `mark` (a failed recording), restoring the storages it wrote."""
        n, e, lz, st, undo, self.step, nc, nr = mark
        self.churned = False
        del self.checks[nc:]
        for stream, counter in reversed(self.rng_undo[nr:]):  # (the op, run eagerly instead, draws these again)
            stream.rng_counter = counter
        del self.rng_undo[nr:]
        for storage, before in reversed(self.undo[undo:]):
            storage._tpu = before
        for v in self.ext[e:]:
            self.ext_index.pop(id(v), None)
        del self.ext_refs[e:]
        del self.nodes[n:], self._node_shapes[n:], self.ext[e:], self.lazies[lz:]
        del self.storages[st:], self.undo[undo:]

    # -- inputs ---------------------------------------------------------------------------------------
    def _ext(self, value: Any) -> tuple:
        """A reference to input `value` of the fused computation: an array once per trace however often it is
        read; a Python number once per use, so the trace's wiring never depends on which numbers happen to be
        equal (or the same object: small ints and bools are) on one step and not on the next."""
        if type(value) in _NUMBERS:
            sig = ("x", len(self.ext), type(value))
            self.ext.append(value)
            self.ext_refs.append(sig)
            return sig
        i = self.ext_index.get(id(value))
        if i is None or self.ext[i] is not value:
            i = len(self.ext)
            self.ext.append(value)
            self.ext_index[id(value)] = i
            sig = ("x", i, value.shape, value.dtype)
            self.ext_refs.append(sig)
            return sig
        return self.ext_refs[i]

    def _ref(self, base: Any) -> tuple:
        if isinstance(base, Lazy):
            if base.value is not None:
                return self._ext(base.value)
            return ("n", base.node, base.index)
        return self._ext(base)

    def tensor_ref(self, t: torch.Tensor) -> tuple:
        """A reference to tensor `t`'s value (through its view) for a node argument."""
        st = t.untyped_storage()
        return self.storage_ref(t, st, getattr(st, "_tpu", None))

    def storage_ref(self, t: torch.Tensor, st: Any, base: Any) -> tuple:
        """`tensor_ref(t)` for a caller that already read t's storage `st` and its value `base`."""
        if base is None:  # a CPU tensor (a 0-dim scalar)
            return self._ext(tt.cpu_to_jax(t))
        if type(base) is Lazy:  # the usual case, inline: the whole of a pending value
            if base.shape == t.shape and t.storage_offset() == 0 and t.is_contiguous():
                return ("n", base.node, base.index) if base.value is None else self._ext(base.value)
        elif type(base) is tt.Uninit:
            base = self.zeros_for(st)
        elif type(base) is tt.Reinterpreted:  # (a dtype view: the buffer it views, read as its dtype)
            return self._reinterpreted_ref(t, base)
        size, stride, off = tuple(t.shape), t.stride(), t.storage_offset()
        whole = off == 0 and t.is_contiguous() and math.prod(size) == math.prod(base.shape)
        if whole and tuple(base.shape) == size:
            return self._ref(base)
        ref = self._ref(base)
        if whole:
            fn, key = _reshape_fn(size), ("reshape", size)
        elif off and ref[0] == "x":  # a stored array sliced at an offset: an input (a new batch's offset, same program)
            (out,) = self.add(_read_at_fn(size, tuple(stride)), ("read@", size, tuple(stride)),
                              ((ref,), self._ext(off)), [KIND_T, KIND_D], {}, {}, (size, base.dtype))
            return ("n", out.node, out.index)
        else:
            fn, key = _read_fn(size, tuple(stride), off), ("read", size, tuple(stride), off)
        (out,) = self.add(fn, key, ((ref,),), [KIND_T], {}, {}, (size, base.dtype))
        return ("n", out.node, out.index)

    def _reinterpreted_ref(self, t: torch.Tensor, r: tt.Reinterpreted) -> tuple:
        """`storage_ref` of a dtype view (`view(dtype)`, `view_as_real`, ...): the viewed buffer's bytes as t's dtype,
        read through t's view."""
        pst = r.parent
        pb = pst._tpu
        if type(pb) is tt.Uninit:
            pb = self.zeros_for(pst)
        size, stride, off = tuple(t.shape), tuple(t.stride()), t.storage_offset()
        name = np.dtype(r.dtype).name
        (out,) = self.add(_reinterpret_read_fn(name, size, stride, off), ("reinterpret", name, size, stride, off),
                          ((self._ref(pb),),), [KIND_T], {}, {}, (size, r.dtype))
        return ("n", out.node, out.index)

    def zeros_for(self, st: Any) -> Lazy:
        """Storage `st` (made by `empty`, never written) given a pending zeros value recorded in the trace, so
        no array is made outside the fused computation (one would stay held until the flush)."""
        base = st._tpu
        shape, dtype = tuple(base.shape), np.dtype(base.dtype)
        (zeros,) = self.add(_zeros_fn(shape, dtype), ("zeros", shape, dtype), (), [], {}, {},
                            (shape, dtype))
        self.undo.append((st, base))
        st._tpu = zeros
        self.storages.append(weakref.ref(st))
        return zeros

    def pending_bytes(self) -> int:
        """Bytes of the pending values still held (by a tensor's storage) and not yet computed."""
        return sum(lz.size * np.dtype(lz.dtype).itemsize for r in self.lazies
                   if (lz := r()) is not None and lz.value is None)

    # -- nodes ----------------------------------------------------------------------------------------
    def add(self, fn: Callable, fn_key: Any, args: tuple, kinds: list, kwargs: dict,
            kw_kinds: dict, known: tuple | None = None, meta: tuple | None = None) -> list[Lazy | None]:
        """Record fn(*args, **kwargs) (refs already resolved); returns one Lazy per output (None where the
        lowering returns None, e.g. convolution_backward's grad_bias when output_mask leaves it out). A new
        trace's output shapes come from `known` ((shape, dtype) where the caller knows them: this
        module's reshapes, reads, writes and zeros), else from `meta` ((op facts, torch args, kwargs[, written
        targets]): PyTorch's meta kernel, see `_meta_shapes`), else from abstract evaluation of `fn`. Every
        node's recorded shapes are checked against its traced value when the trace is compiled (`_runner`)."""
        desc = (fn_key, tuple([a[0] if k is KIND_T else _desc(a, k) for a, k in zip(args, kinds, strict=False)]),
                tuple(sorted([(n, _desc(v, kw_kinds[n])) for n, v in kwargs.items()])) if kwargs else ())
        nxt = self.step.kids.get(desc)
        if nxt is None:  # a trace not seen before: its shapes from the disk cache, or abstract evaluation
            # (an op that will run alone is not kept in the trie: the same op there next time runs alone again)
            churned = ((_churning(self.step.kids, fn_key) if self.step is not _ROOT else self._root_churning(fn_key))
                       and bool(self.churn_left) and self.serial >= self.churn_wait)
            key = fused_disk.child_key(_step_key(self.step), desc) if runtime.STATE.abstract is None else None
            # (`known` becomes a ShapeDtypeStruct only here, on a new node: a known step pays nothing for it)
            shapes = jax.ShapeDtypeStruct(*known) if known is not None else (
                fused_disk.shapes(key) if key is not None else None)
            if shapes is None and meta is not None:
                shapes = _meta_shapes(*meta)
            if shapes is None:
                shapes = self._shapes(fn, desc, args, kinds, kwargs, kw_kinds)
                if key is not None:
                    fused_disk.remember_shapes(key, shapes)
            nxt = _Step(shapes, key)
            if churned:
                self.churned = True
            else:
                self.step.kids[desc] = nxt
        else:  # a node recorded before: ops whose shapes keep changing may run alone again (CHURN_BUDGET)
            self.churn_left = CHURN_BUDGET
        shapes = nxt.shapes
        self.step = nxt
        self._node_shapes.append(shapes)
        idx = len(self.nodes)
        if not idx:
            self._pause_gc()
        self.nodes.append((fn, args, kinds, kwargs, kw_kinds))
        if not isinstance(shapes, tuple | list):
            out = Lazy(self, idx, None, shapes.shape, shapes.dtype)
            self.lazies.append(weakref.ref(out))
            return [out]
        outs = [None if s is None else Lazy(self, idx, j, tuple(s.shape), s.dtype) for j, s in enumerate(shapes)]
        self.lazies.extend([weakref.ref(o) for o in outs if o is not None])
        return outs

    def _churn_paid(self, paid: bool) -> None:
        """Note whether the ops run alone before this flush let it reuse a program; twice in a row not: wait
        (CHURN_RETRY_MAX)."""
        self.churn_ran = False
        if paid:
            self.churn_fails, self.churn_tried = 0, False
        elif not self.churn_tried:  # (the first time, what follows the ops run alone is new in any case)
            self.churn_tried = True
        else:
            self.churn_fails += 1
            self.churn_tried = False
            self.churn_wait = self.serial + min(4 ** self.churn_fails, CHURN_RETRY_MAX)

    def _root_churning(self, fn_key: Any) -> bool:
        """Whether the op of `fn_key`, beginning this trace with new shapes, also began CHURN_SEEN recent traces
        so (see ROOT_WINDOW), or follows an op run alone with nothing recorded in between."""
        head = _head(fn_key)
        last, streak = self.root_new.get(head, (0, 0))
        if last != self.serial:
            streak = streak + 1 if self.serial - last <= ROOT_WINDOW else 1
            self.root_new[head] = (self.serial, streak)
        # (an op ran alone just before, and this one is new too: it most likely reads what that op made)
        return streak > CHURN_SEEN or self.churn_ran

    def _abstract(self, ref: tuple) -> Any:
        if ref[0] == "x":
            v = self.ext[ref[1]]
            return v if isinstance(v, int | float) else jax.ShapeDtypeStruct(v.shape, v.dtype)
        node_outs = self._node_shapes[ref[1]]
        return node_outs if ref[2] is None else node_outs[ref[2]]

    def _shapes(self, fn, desc, args, kinds, kwargs, kw_kinds):
        sig = (desc, tuple(_arg_shapes(a, k, self) for a, k in zip(args, kinds, strict=True)),
               tuple(sorted((n, _arg_shapes(v, kw_kinds[n], self)) for n, v in kwargs.items())))
        out = _SHAPE_CACHE.get(sig)
        if out is None:
            abs_args = [_resolve(a, k, self._abstract) for a, k in zip(args, kinds, strict=True)]
            abs_kw = {n: _resolve(v, kw_kinds[n], self._abstract) for n, v in kwargs.items()}
            is_abs = lambda x: isinstance(x, jax.ShapeDtypeStruct)  # noqa: E731
            flat, tree = jax.tree_util.tree_flatten((abs_args, abs_kw), is_leaf=is_abs)
            dyn = [i for i, x in enumerate(flat) if is_abs(x)]

            def concrete(*d):
                f = list(flat)
                for i, v in zip(dyn, d, strict=True):
                    f[i] = v
                a, k = jax.tree_util.tree_unflatten(tree, f)
                return fn(*a, **k)

            out = jax.eval_shape(concrete, *[flat[i] for i in dyn])
            _SHAPE_CACHE[sig] = out
        return out

    # -- running --------------------------------------------------------------------------------------
    def flush(self, reason: str) -> None:
        """Compile (or reuse) and run everything recorded; store the results in their storages."""
        if not self.nodes:
            return
        try:
            self._run(reason)
        finally:
            self._resume_gc()  # (also when compiling or running the trace failed)

    def _run(self, reason: str) -> None:
        live = [lz for r in self.lazies if (lz := r()) is not None and lz.value is None]
        outs = tuple((lz.node, lz.index) for lz in live)
        donate = _donatable(self.ext)
        key = (outs, donate)
        fn = self.step.compiled.get(key)
        if self.churn_ran:
            self._churn_paid(fn is not None)
        checks = self.checks
        if fn is None:  # (the trie step, the outputs and the donated inputs determine the computation)
            fn = self.step.compiled[key] = cache.put(("fused", self.step, key), self._compiled(outs, donate))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_UNUSED_DONATION)
            try:
                results = cache.call(fn, "fused graph", *self.ext)
            except jax.errors.JaxRuntimeError as e:  # (e.g. out of memory: it would fail again if kept)
                self._lose(f"{str(e).splitlines()[0]}")
                raise memory.translate(e)  # noqa: B904 - out of memory becomes torch.OutOfMemoryError
            except ShapeMismatch as e:  # (the tensors of this trace have no consistent value: none is given one)
                self._lose(str(e))
                raise
        if checks:  # (the checked nodes' records come last: read at the next sync point)
            asserts.pend((results[-1], tuple((op, where) for _, op, where in checks)))
            results = results[:-1]
        track = tt.track  # (torch.tpu.synchronize waits for what is in flight)
        for lz, r in zip(live, results, strict=True):
            lz.value = r
            track(r)
        for stref in self.storages:
            st = stref()
            lz = getattr(st, "_tpu", None) if st is not None else None
            if type(lz) is Lazy and lz.trace is self and lz.value is not None:
                st._tpu = lz.value
        events.record("flush", reason)
        self.cutter.flushed([node[0] for node in self.nodes], reason)
        self.reset()


    def _compiled(self, outs: tuple, donate: tuple) -> Callable:
        """The fused computation of this trace: jitted, or loaded from the disk cache when the trace is kept
        there (`_Kept`: compiled now and saved when it was not)."""
        checked = frozenset(c[0] for c in self.checks)
        fn = jax.jit(_runner(list(self.nodes), outs, checked, list(self._node_shapes)), donate_argnums=donate)
        fused_disk.save_shapes()
        tkey = (fused_disk.trace_key(self.step.key, outs, donate, checked)
                if self.step.key is not None and runtime.STATE.abstract is None and _one_device(self.ext) else None)
        if tkey is None:
            return fn
        return _Kept(fn, tkey)

    def at_limit(self) -> None:
        """The trace reached `limit` nodes (at an op boundary): flush it where it is too long or ends a repeated
        step (`fused_cut`), else note where to ask again."""
        n = len(self.nodes)
        if n > self.cutter.max_nodes:
            self.flush("size")
        elif self.cutter.due([node[0] for node in self.nodes],
                             probe=not torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1):
            self.flush(fused_cut.REASON)
        else:
            self.limit = self.cutter.limit(n)

    def _lose(self, why: str) -> None:
        """Drop the trace after its computation failed: storages waiting for its results hold `Lost`."""
        lost = Lost(why)
        for stref in self.storages:
            st = stref()
            lz = getattr(st, "_tpu", None) if st is not None else None
            if type(lz) is Lazy and lz.trace is self and lz.value is None:
                st._tpu = lost
        self.cutter.broken()
        self.reset()


class Lost:
    """The value of a tensor whose deferred computation failed (e.g. out of memory): reading it raises."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def __getattr__(self, name: str):
        raise RuntimeError(f"this tpu tensor has no value: the fused computation producing it failed ({self.why})")


_SHAPE_CACHE: dict = {}
_UNUSED_DONATION = "Some donated buffers were not usable"


def _step_key(step: _Step) -> str | None:
    """`step`'s disk cache key; the root's is the code fingerprint (None with the cache off)."""
    return fused_disk.root_key() if step is _ROOT else step.key


_JIT_ONLY = object()
"""(`_Kept.exe` once a call's inputs did not match the executable: the jitted function runs from then on)"""


_kept: weakref.WeakSet = weakref.WeakSet()
"""Every live `_Kept` (their executables are dropped when the process holds too many: `executables.purge`)."""


def _drop_kept() -> None:
    for k in list(_kept):
        if k.exe is not _JIT_ONLY:
            k.exe = None


executables.holders.append(_drop_kept)


class _Kept:
    """A fused computation kept in the disk cache: its first call loads the executable (or compiles and saves
    it); once a call's inputs differ from the executable's in type or placement (e.g. sharded over a mesh),
    the jitted function runs instead. Looks like a jitted function to `cache.call` (`_cache_size`: executables this process
    built, loaded ones included, as JAX counts one it finds in its own persistent cache: `tputool diagnose`
    reports compiles as a TPU's empty cache would have them)."""

    __slots__ = ("jitted", "key", "exe", "__weakref__")

    def __init__(self, jitted: Callable, key: str) -> None:
        self.jitted, self.key, self.exe = jitted, key, None
        _kept.add(self)

    def _cache_size(self) -> int:
        return (self.exe is not None) + self.jitted._cache_size()

    def __call__(self, *ext):
        if self.exe is None and not _one_device(ext):  # (a later trace of this step with sharded inputs, its
            self.exe = _JIT_ONLY                         # executable dropped: the disk keeps one-device programs)
        if self.exe is None:
            exe = fused_disk.load(self.key, _device_of(ext))
            if exe is None:
                hits = persistent_cache.stats["hits"]
                exe = self.jitted.lower(*ext).compile()
                if persistent_cache.stats["hits"] == hits:  # (XLA:CPU cannot serialize what JAX's cache loaded)
                    fused_disk.save(self.key, exe)
            self.exe = exe
        elif self.exe is _JIT_ONLY:
            return self.jitted(*ext)
        try:
            return self.exe(*ext)
        except (TypeError, ValueError):  # (inputs of other types or placements than it was compiled for, e.g.
            self.exe = _JIT_ONLY        # sharded over a mesh: refused before running; jax.jit handles them)
            return self.jitted(*ext)


def _one_device(ext) -> bool:
    """Whether every array input lives on one device (what the disk cache keeps programs for)."""
    return all(len(v.sharding.device_set) == 1 for v in ext if isinstance(v, jax.Array))


def _device_of(ext) -> Any:
    """The one device the array inputs live on (None: no array input)."""
    for v in ext:
        if isinstance(v, jax.Array):
            return next(iter(v.sharding.device_set))
    return None


def _donatable(ext: list) -> tuple[int, ...]:
    """Positions of the inputs nothing but the trace holds (an input whose storage the trace overwrote,
    e.g. a parameter updated in place): donated, XLA writes the new value into the old buffer instead of
    allocating one (on CPU, fresh pages cost more than the update itself)."""
    # Held only by the list: getrefcount sees the list's reference and its own argument.
    return tuple(i for i in range(len(ext)) if isinstance(ext[i], jax.Array) and sys.getrefcount(ext[i]) <= 2)


def _desc(a: Any, kind: tuple) -> Any:
    k = kind[0]
    if k == "T":
        return a[0]
    if k == "L":
        return ("L", tuple(a))
    if k == "d":
        return ("d", a)
    if k == "D":
        return ("D", tuple(a))
    return ("s", _static(a))


def _arg_shapes(a: Any, kind: tuple, trace: Trace) -> Any:
    k = kind[0]
    if k == "T":
        return _shape_of(a[0], trace)
    if k == "L":
        return tuple(None if r is None else _shape_of(r, trace) for r in a)
    return None


def _shape_of(ref: tuple, trace: Trace) -> tuple:
    s = trace._abstract(ref)
    return (s.shape, s.dtype) if hasattr(s, "shape") else ("py", s)


def _resolve(a: Any, kind: tuple, get: Callable) -> Any:
    k = kind[0]
    if k == "T":
        return get(a[0])
    if k == "L":
        return [None if r is None else get(r) for r in a]
    if k == "d":
        return get(a)
    if k == "D":
        return [get(r) for r in a]
    return a


def _runner(nodes: list, outs: tuple, checked: frozenset = frozenset(), shapes: list | None = None) -> Callable:
    """The fused computation: every node in order, returning the `outs` values, then (when some nodes are
    `checked`) their check records stacked in node order. With `shapes` (each node's recorded output shapes),
    each traced value is checked against them (`_check_shapes`)."""
    names = [getattr(fn, "op_name", "op") for fn, *_ in nodes]  # (each node's ops named after it: TPU profiles)

    def run(*ext):
        vals: list = []
        records: list = []

        def get(ref):
            if ref[0] == "x":
                return ext[ref[1]]
            v = vals[ref[1]]
            return v if ref[2] is None else v[ref[2]]

        for j, (fn, args, kinds, kwargs, kw_kinds) in enumerate(nodes):
            a = [_resolve(x, k, get) for x, k in zip(args, kinds, strict=True)]
            kw = {n: _resolve(v, kw_kinds[n], get) for n, v in kwargs.items()}
            with jax.named_scope(names[j]):
                if j in checked:
                    out, record = run_checked(fn, *a, **kw)
                    records.append(record)
                else:
                    out = fn(*a, **kw)
            if shapes is not None:
                _check_shapes(out, shapes[j], fn)
            vals.append(out)
        results = tuple(vals[n] if i is None else vals[n][i] for n, i in outs)
        return results + (jax.numpy.stack(records),) if records else results

    return run


@functools.cache
def _zeros_fn(shape: tuple, dtype: np.dtype) -> Callable:
    return _named(lambda: jax.numpy.zeros(shape, dtype), "zeros")


@functools.cache
def _reinterpret_read_fn(dtype: str, size: tuple, stride: tuple, off: int) -> Callable:
    from tputool.backend.views import reinterpret, strided_read

    return _named(lambda base: strided_read(reinterpret(base.reshape(-1), dtype), size, stride, off), "reinterpret")


@functools.cache
def _reshape_fn(size: tuple) -> Callable:
    return _named(lambda x: x.reshape(size), "reshape")


@functools.cache
def _read_fn(size: tuple, stride: tuple, off: int) -> Callable:
    from tputool.backend.views import strided_read

    return _named(lambda base: strided_read(base.reshape(-1), size, stride, off), "read")


@functools.cache
def _read_at_fn(size: tuple, stride: tuple) -> Callable:
    from tputool.backend.views import strided_read_at

    return _named(lambda base, off: strided_read_at(base.reshape(-1), size, stride, off), "read")


@functools.cache
def _write_at_fn(base_shape: tuple, size: tuple, stride: tuple) -> Callable:
    from tputool.backend.views import strided_write_at

    return _named(lambda base, v, off: strided_write_at(base.reshape(-1), v, size, stride, off).reshape(base_shape),
                  "write")


@functools.cache
def _write_fn(base_shape: tuple, size: tuple, stride: tuple, off: int) -> Callable:
    from tputool.backend.views import strided_write

    return _named(lambda base, v: strided_write(base.reshape(-1), v, size, stride, off).reshape(base_shape), "write")


def _head(fn_key: Any) -> Any:
    return fn_key[0] if type(fn_key) is tuple else fn_key


def _churning(kids: dict, fn_key: Any) -> bool:
    """Whether the op of `fn_key` (new here) had CHURN_SEEN other descriptions at this place of the trie already."""
    head, seen = _head(fn_key), 0
    for desc in kids:
        if _head(desc[0]) == head:
            seen += 1
            if seen >= CHURN_SEEN:
                return True
    return False


def _named(fn: Callable, name: str) -> Callable:
    """`fn` with the name its ops carry in the fused computation (`_runner`; an op node's is its op's key)."""
    fn.op_name = name
    return fn


class ShapeMismatch(RuntimeError):
    """A recorded node's traced value has other shapes or dtypes than the tensors handed out for it."""


def _check_shapes(out: Any, want: Any, fn: Callable) -> None:
    """Raise ShapeMismatch unless traced value(s) `out` have the recorded shapes `want` (ShapeDtypeStructs, or a
    tuple/list of them and None): tensors already handed out carry `want`'s metadata, so a difference is never
    let through."""
    if isinstance(want, tuple | list):
        ok = isinstance(out, tuple | list) and len(out) == len(want) and all(
            (w is None and o is None) or (w is not None and o is not None and o.shape == tuple(w.shape)
                                          and o.dtype == w.dtype) for o, w in zip(out, want, strict=False))
    else:
        ok = hasattr(out, "shape") and out.shape == tuple(want.shape) and out.dtype == want.dtype
    if not ok:
        def show(v: Any) -> Any:
            if isinstance(v, tuple | list):
                return [show(x) for x in v]
            return None if v is None else (tuple(v.shape), str(v.dtype))

        raise ShapeMismatch(f"tpu Fused mode: {getattr(fn, 'op_name', getattr(fn, '__name__', fn))} computed "
                            f"{show(out)} where {show(want)} was recorded; run with "
                            "torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER) and please report it")


def _meta_shapes(f: _OpFacts, args: tuple, kwargs: dict, targets: list | None = None) -> Any:
    """The output shapes and dtypes of op `f` on these torch arguments from PyTorch's meta kernel (C++: far
    cheaper than evaluating the lowering abstractly), or None where it has none (the op is then not asked again).
    For an in-place op (`targets`: the tensors it writes, `op_plan.written_tensors`) whose results surely cast to
    its targets (`_same_float`: meta kernels do not all check a cast, `int.mul_(float)`), the meta kernel checks
    the arguments as the op would (broadcasting into a target: PyTorch's own error, raised by the abstract
    evaluation it falls back to) and the node's outputs are its targets' shapes and dtypes, as
    `op_plan.cast_results` makes them."""
    if targets is not None and not _same_float(targets, args, kwargs):
        return None
    def meta(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="meta")
        if isinstance(v, list | tuple) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(meta(x) for x in v)
        return v

    def sds(t: Any) -> Any:
        if t is None:
            return None
        if isinstance(t, list | tuple):
            return type(t)(sds(x) for x in t)
        return jax.ShapeDtypeStruct(tuple(t.shape), tt.dtypes.to_np(t.dtype))

    try:
        kw = {n: meta(v) for n, v in kwargs.items()}
        if "device" in kw:
            kw["device"] = "meta"
        out = f.op(*[meta(v) for v in args], **kw)
    except Exception:  # noqa: BLE001 - no meta kernel, one that needs data, or arguments it refuses: abstract
        f.meta = False  # evaluation instead (which raises the op's error, if any)
        return None
    if targets is None:
        return sds(out)
    return tuple(jax.ShapeDtypeStruct(tuple(t.shape), tt.dtypes.to_np(t.dtype)) for t in targets)


def _same_float(targets: list, args: tuple, kwargs: dict) -> bool:
    """Whether every target and every tensor argument has one floating dtype and no argument is a complex number:
    then an elementwise in-place op's result has the targets' dtype (Python numbers do not promote a float)."""
    dt = targets[0].dtype if targets else None
    if dt is None or not dt.is_floating_point:
        return False
    for v in (*targets, *args, *kwargs.values()):
        for x in v if isinstance(v, list | tuple) else (v,):
            if isinstance(x, torch.Tensor) and x.dtype != dt or isinstance(x, complex):
                return False
    return True


@functools.cache
def _cast_fn(fn: Callable, dtypes: tuple | None, shapes: tuple | None, rng_words: bool, name: str) -> Callable:
    """A recorded node's function: the lowering (its RNG key made from recorded words), with the results of an
    in-place op checked and cast for writing into its targets (`dtypes`: torch dtypes) as eager dispatch does."""
    def cast(*args, **kwargs):
        if rng_words:
            kwargs = dict(kwargs)
            kwargs["rng_key"] = rng.key_from_words(kwargs.pop("rng_words"))
        out = fn(*args, **kwargs)
        if dtypes is None:
            return out
        return op_plan.cast_results(out, dtypes, shapes, name)

    cast.op_name = name
    return cast


TRACE = Trace()
runtime.STATE.trace = TRACE


# ---- the dispatch mode ------------------------------------------------------------------------------

def _tensors(args: tuple, kwargs: dict) -> list:
    out = []
    for v in (*args, *kwargs.values()):
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, list | tuple):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
    return out


def _has_lazy(args: Any, kwargs: dict) -> bool:
    for x in _tensors(args, kwargs):
        if isinstance(x, torch.Tensor) and x.device.type == "tpu":
            if x.layout is not _STRIDED:  # (a sparse tensor holds no storage: its indices and values do)
                if x.is_sparse and _has_lazy((x._indices(), x._values()), {}):
                    return True
                continue
            base = getattr(x.untyped_storage(), "_tpu", None)
            if type(base) is tt.Reinterpreted:  # (a dtype view: pending where the buffer it views is)
                base = base.parent._tpu
            if isinstance(base, Lazy):
                return True
    return False


def _is_data_tensor(x: Any) -> bool:
    # (only this backend's storages carry `_tpu`: CPU tensors and fake/meta tensors on the tpu device do not;
    # cheaper than building x.device. Sparse/mkldnn tensors have no storage to ask.)
    return isinstance(x, torch.Tensor) and x.layout is _STRIDED and hasattr(x.untyped_storage(), "_tpu")


_STRIDED = torch.strided
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_get_dispatch_mode, _PROXY = torch._C._get_dispatch_mode, torch._C._TorchDispatchModeKey.PROXY
_INFRA = (_FakeTensor, _FunctionalTensor)
"""Tensors of PyTorch's tracing modes (fake, functionalization), which run below this one: their ops are passed
on to those modes (a wrapper subclass's own __torch_dispatch__ would refuse them: "FunctionalTensor on its own")."""


def _on_tpu(device: Any) -> bool:
    """True for a `device=` argument naming the tpu device."""
    return device is not None and torch.device(device).type == "tpu"


def _is_view(op: torch._ops.OpOverload) -> bool:
    rets = op._schema.returns
    return bool(rets) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in rets)


class _OpFacts:
    """What the mode needs to know about one op, worked out on its first call (the hot path then does one
    dict lookup per op instead of re-reading the schema or hashing the op many times)."""

    __slots__ = ("op", "composite", "runs_as_usual", "key", "low", "written", "out_variant", "n_returns",
                 "returns_list", "names", "args", "pos_args", "plain_fn", "plain_key", "is_to_copy", "geometry",
                 "decomposition", "like_factory", "sees_bits", "meta")

    def __init__(self, func: torch._ops.OpOverload) -> None:
        plan = op_plan.plan(func)
        self.op = func  # (held: _FACTS is keyed by its id)
        self.composite = torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
        self.runs_as_usual = func in PASSTHROUGH or _is_view(func)
        self.geometry = GEOMETRY.get(func) if self.runs_as_usual else None
        self.is_to_copy = func is aten._to_copy.default
        self.like_factory = op_plan.is_like_factory(func)
        # PyTorch resolves conjugate/negative views before most ops; these see the bits (copy_, clone, mm...)
        self.sees_bits = any(torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), k)
                             for k in ("Conjugate", "Negative"))
        schema_args = func._schema.arguments
        self.written = list(plan.written)
        self.out_variant = plan.out_variant  # (out= variants run eagerly: plan.traced is None for them)
        self.low = plan.traced
        self.decomposition = None if plan.written else plan.decomposition  # (functional ops only)
        self.key = str(func)
        self.plain_key = (self.key,)
        self.plain_fn = _cast_fn(self.low.fn, None, None, self.low.needs_rng, self.key) if self.low is not None else None
        rets = func._schema.returns
        self.n_returns = len(rets)
        self.returns_list = len(rets) == 1 and isinstance(rets[0].type, torch._C.ListType)
        self.names = [a.name for a in schema_args]
        self.args, self.pos_args = _arg_facts(func, self.low is not None and self.low.dynamic_floats)
        self.meta = (self.low is not None and not self.low.needs_rng and not self.low.may_refuse and META_SHAPES
                     and torch.Tag.inplace_view not in func.tags)  # (t_, squeeze_: their lowering refuses the write)
        """Whether a new trace takes this op's output shapes from PyTorch's meta kernel (`_meta_shapes`)."""


_FACTS: dict[int, _OpFacts] = {}
"""id(op) -> its _OpFacts (OpOverload objects live as long as the process; id() is cheaper than their hash)."""


_on_lowerings_change(_FACTS.clear)  # (a lowering registered later changes what an op's facts say)
_on_lowerings_change(fused_disk.lowerings_changed)


def _facts(func: torch._ops.OpOverload) -> _OpFacts:
    f = _FACTS[id(func)] = _OpFacts(func)
    return f


def _skip_dynamo(fn: Callable) -> Callable:
    """`fn` run with Dynamo's frame evaluation off (what TorchDispatchMode's own wrapper does for a
    `__torch_dispatch__`, without its per-call bookkeeping: this runs once per op)."""
    try:
        from torch._C._dynamo.eval_frame import set_eval_frame
    except ImportError:  # another PyTorch layout: keep the stock wrapper
        return torch._disable_dynamo(fn, recursive=True)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        prior = set_eval_frame(None)
        try:
            return fn(*args, **kwargs)
        finally:
            set_eval_frame(prior)

    return run


class FuseMode(TorchDispatchMode):
    """Defers ops on tpu tensors into TRACE (see the module docstring)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # __torch_dispatch__ is wrapped below by the cheaper _skip_dynamo instead

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Let torch.compile compile frames while Fused mode is on: Dynamo traces with the mode off, and the
        compiled graph reads concrete inputs (`graph.boundary.to_jax` materializes pending ones)."""
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 - torch's API
        kwargs = kwargs or {}
        if _get_dispatch_mode(_PROXY) is not None:  # make_fx tracing real tensors: its mode, below, runs the op
            if _has_lazy(args, kwargs):
                TRACE.flush(f"{func} (traced by make_fx)")
            return func(*args, **kwargs)
        for x in args:  # (the usual case first: a tensor argument with data on the device)
            if isinstance(x, torch.Tensor) and x.layout is _STRIDED and hasattr(x.untyped_storage(), "_tpu"):
                break
        else:
            tensors = _tensors(args, kwargs)
            if not any(_is_data_tensor(x) for x in tensors) and (tensors or not _on_tpu(kwargs.get("device"))):
                if any(type(x) not in _PLAIN and not isinstance(x, _INFRA) for x in tensors):
                    return NotImplemented  # (a wrapper subclass, e.g. DTensor: its ops on tpu tensors come back here)
                return func(*args, **kwargs)  # (a factory for the tpu device, e.g. full or scalar_tensor, is recorded)
        f = _FACTS.get(id(func)) or _facts(func)
        if f.composite:  # e.g. to/reshape/contiguous: their parts come back through this mode
            with self:
                return func.decompose(*args, **kwargs)
        if f.runs_as_usual:
            if f.geometry is not None:  # a common view: made here, without PyTorch's trip through as_strided
                geo = f.geometry(*args, **kwargs)
                if geo is not None:
                    return tt.alias(args[0], *geo)
            return func(*args, **kwargs)
        if f.like_factory and not _on_tpu(kwargs.get("device", "tpu")):
            return op_plan.like_elsewhere(func, args, kwargs)  # (needs only the input's metadata: nothing flushed)
        mark = TRACE.mark()
        try:
            handled = _record(func, f, args, kwargs)
        except RunEagerly as e:
            TRACE.rollback(mark)
            if _has_lazy(args, kwargs):
                TRACE.flush(SYNC_REASONS.get(func) or f"{func} ({e.reason})")
            return func(*args, **kwargs)
        except torch.OutOfMemoryError:  # (a result that cannot fit: refused at its op, as Strict mode refuses it)
            TRACE.rollback(mark)
            raise
        except Exception as e:  # noqa: BLE001 - any failure to defer falls back to running the op as Strict does
            # An exception raised here on autograd's tpu worker thread aborts the process ("terminate called
            # without an active exception"), so a failed recording never propagates: the op runs eagerly on
            # concrete inputs, which gives Strict mode's result or Strict mode's error.
            TRACE.rollback(mark)
            if _has_lazy(args, kwargs):
                TRACE.flush(f"{func} (could not defer: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})")
            return func(*args, **kwargs)
        if handled is not NotImplemented:
            if TRACE.churned:  # (its shapes keep changing here: it runs alone, the trace before it is kept whole)
                TRACE.rollback(mark)
                if _has_lazy(args, kwargs):
                    TRACE.flush(f"{func} (its shapes or constant arguments keep changing here: run alone)")
                TRACE.churn_left -= 1  # (after the flush of the prefix, which refills the budget)
                TRACE.churn_ran = True
                return func(*args, **kwargs)
            del TRACE.undo[mark[4]:], TRACE.rng_undo[mark[7]:]  # recorded: nothing to roll back (old values freed)
            if len(TRACE.nodes) >= TRACE.limit:
                TRACE.at_limit()
            return handled
        TRACE.churned = False  # (a read recorded for an op that is not: the op below decides by its own nodes)
        decomp = f.decomposition
        if decomp is not None:
            if func in SYNC_REASONS and _has_lazy(args, kwargs):  # (e.g. .cpu(): named as the copy it is, not
                TRACE.flush(SYNC_REASONS[func])                    # after the first of its parts that reads data)
            with self:  # its smaller ops come back through this mode
                out = decomp(*args, **kwargs)
            if out is not NotImplemented:
                return out
        if _has_lazy(args, kwargs):
            TRACE.flush(SYNC_REASONS.get(func) or f"{func} (no lowering)")
        return func(*args, **kwargs)


FuseMode.__torch_dispatch__ = _skip_dynamo(FuseMode.__dict__["__torch_dispatch__"])



def _arg_facts(op: torch._ops.OpOverload, floats: bool = False) -> tuple[dict, list]:
    """Per argument of `op`, computed once: (is a number list, is a number, has a default, the default);
    by name and in positional order (schema objects are rebuilt on every access, so never on the hot path).
    A `Tensor` argument counts as a number too: a Python number there is a wrapped number (`x / n`), an input as
    in Strict mode (`dispatch.LoweredOp`), so an average's changing count compiles nothing new. With `floats` (a
    lowering with `dynamic_floats`), `float` arguments count as numbers too."""
    numbers = (torch._C.NumberType, torch._C.FloatType) if floats else torch._C.NumberType

    def facts(a) -> tuple:
        is_list = isinstance(a.type, torch._C.ListType) and isinstance(a.type.getElementType(), torch._C.NumberType)
        t = a.type.getElementType() if isinstance(a.type, torch._C.OptionalType) else a.type
        has_default = a.has_default_value()
        return (is_list, isinstance(a.type, numbers) or isinstance(t, torch._C.TensorType), has_default,
                a.default_value if has_default else None)

    args = op._schema.arguments
    return {a.name: facts(a) for a in args}, [facts(a) for a in args if not a.kwarg_only]


class RunEagerly(Exception):  # noqa: N818 - a signal, not an error
    """Raised while recording an op that must run as in Strict mode instead (after a flush, never through a
    decomposition); `reason` ends the flush's reason."""

    reason = "not deferred"


class HostOperand(RunEagerly):
    """Raised while recording when a CPU tensor with elements is among a tpu op's operands: the op runs as in
    Strict mode instead (a copy between devices, CPU indices moved to the device, or PyTorch's mixed-device
    error), never through a decomposition (which would word that error otherwise)."""

    reason = "a CPU operand"


class ViewBits(RunEagerly):
    """Raised while recording an op that sees conjugate/negative views (`_OpFacts.sees_bits`) given one: Strict
    mode's kernels resolve the bits, the recorded lowering would read the unresolved values."""

    reason = "a conjugate or negative view"


class DtypeView(RunEagerly):
    """Raised while recording an op that reads or writes a dtype view (`tensor.Reinterpreted`): it runs as in
    Strict mode, which reads and writes the viewed buffer (computing it first where it is pending)."""

    reason = "a dtype view (view(dtype), view_as_real, view_as_complex)"


KIND_T, KIND_L, KIND_S, KIND_D, KIND_DL = ("T",), ("L",), ("s",), ("d",), ("D",)
"""Argument kinds of a recorded node: tensor ref, list of refs, static value, number input, number-list inputs."""
_NUMBERS = (int, float, bool)
"""Python values of a `Scalar` argument that become inputs of the fused computation (`_conv`): one program serves
every value (e.g. `torch.full(size, done)` with `done` True on a loop's last step only). Lists of numbers: ints
and floats."""


def _conv(v: Any, a: tuple | None, trace: Trace, static_scalars: bool) -> tuple | None:
    """(recorded form, kind) of one argument value; `a`: its schema facts (see _arg_facts)."""
    if isinstance(v, torch.Tensor):
        if _is_data_tensor(v) or (v.device.type == "cpu" and v.layout is _STRIDED and v.dim() == 0):
            return trace.tensor_ref(v), KIND_T
        if v.device.type == "cpu":
            raise HostOperand
        return None  # a tpu tensor without data (fake/meta)
    if isinstance(v, list | tuple) and v and any(isinstance(x, torch.Tensor) for x in v):
        refs = []
        for x in v:
            if x is None:
                refs.append(None)
            elif _is_data_tensor(x):
                refs.append(trace.tensor_ref(x))
            elif x.device.type == "cpu" and x.dim() > 0:
                raise HostOperand
            else:
                return None
        return refs, KIND_L
    if static_scalars or a is None:
        return v, KIND_S
    if a[0] and isinstance(v, list | tuple) and all(type(x) in (int, float) for x in v):
        return [trace._ext(x) for x in v], KIND_DL
    if a[1] and type(v) in _NUMBERS and not (a[2] and v == a[3]):
        return trace._ext(v), KIND_D
    return v, KIND_S


def _kinds(f: _OpFacts, args: tuple, kwargs: dict, trace: Trace, static_scalars: bool = False) -> tuple | None:
    """Resolved (args, kinds, kwargs, kw_kinds) for recording, or None if an argument cannot be deferred.
    Number arguments become inputs of the fused computation unless `static_scalars` (the lowering needs them
    as Python numbers) or they equal the schema default."""
    pos_schema = f.pos_args
    n_pos = len(pos_schema)
    out_args, kinds = [], []
    for i, v in enumerate(args):
        if isinstance(v, torch.Tensor) and v.layout is _STRIDED:  # the usual case, inline: data on the device
            st = v.untyped_storage()
            base = getattr(st, "_tpu", None)
            if base is not None:
                out_args.append((trace.storage_ref(v, st, base),))
                kinds.append(KIND_T)
                continue
        r = _conv(v, pos_schema[i] if i < n_pos else None, trace, static_scalars)
        if r is None:
            return None
        out_args.append((r[0],) if r[1] is KIND_T else r[0])
        kinds.append(r[1])
    if not kwargs:
        return tuple(out_args), kinds, {}, {}
    schema = f.args
    out_kw, kw_kinds = {}, {}
    for n, v in kwargs.items():
        r = _conv(v, schema.get(n), trace, static_scalars)
        if r is None:
            return None
        out_kw[n], kw_kinds[n] = ((r[0],), r[1]) if r[1] is KIND_T else r
    return tuple(out_args), kinds, out_kw, kw_kinds


def _record(func: torch._ops.OpOverload, f: _OpFacts, args: tuple, kwargs: dict) -> Any:
    if f.is_to_copy and kwargs.get("device") is not None and torch.device(kwargs["device"]).type != "tpu":
        return NotImplemented
    low, written = f.low, f.written
    if low is None or f.out_variant:
        return NotImplemented  # (no lowering, or an out= variant: runs eagerly)
    if f.sees_bits and any(t.is_conj() or t.is_neg() for t in _tensors(args, kwargs)):
        raise ViewBits
    if written:
        vals = list(args) + [kwargs.get(n) for n in f.names[len(args):]]
        targets = op_plan.written_tensors(vals, written)
        if not all(_is_data_tensor(t) for t in targets):
            return NotImplemented
    gen = None
    if low.needs_rng and "generator" in kwargs:  # (the key is drawn from its stream: no argument of the node)
        kwargs = dict(kwargs)
        gen = kwargs.pop("generator")
    conv = _kinds(f, args, kwargs, TRACE, low.static_scalars)
    if conv is None:
        return NotImplemented
    a, kinds, kw, kw_kinds = conv
    if low.needs_rng:
        stream = rng.STATE if gen is None else rng.stream_of(gen)
        TRACE.rng_undo.append((stream, stream.rng_counter))
        kw = {**kw, "rng_words": TRACE._ext(rng.next_words(stream))}
        kw_kinds = {**kw_kinds, "rng_words": KIND_D}
    if low.checked:  # (the node about to be recorded; rolled back with it if recording fails)
        TRACE.checks.append((len(TRACE.nodes), f.key, asserts.site()))
    if not written:
        outs = TRACE.add(f.plain_fn, f.plain_key, a, kinds, kw, kw_kinds, None, (f, args, kwargs) if f.meta else None)
        if KIND_T not in kinds and KIND_L not in kinds and KIND_T not in kw_kinds.values():
            _check_alloc(outs)  # (a factory: an allocation, refused now if it cannot fit, as in Strict mode)
        res = [None if o is None else _new_tensor(o) for o in outs]
        if f.returns_list:
            return res
        return res[0] if f.n_returns == 1 else tuple(res)
    dts = tuple(t.dtype for t in targets)
    shapes = tuple(tuple(t.shape) for t in targets)
    fn = _cast_fn(low.fn, dts, shapes, low.needs_rng, f.key)
    outs = TRACE.add(fn, (f.key, dts, shapes), a, kinds, kw, kw_kinds, None,
                     (f, args, kwargs, targets) if f.meta else None)
    for t, o in zip(targets, outs, strict=True):
        _write(t, o)
    return vals[written[0]] if f.n_returns else None


_NP_TO_TORCH = tt.dtypes.NP_TO_TORCH
_create_empty = torch._C._acc.create_empty_tensor


def _check_alloc(outs: list) -> None:
    """Raise torch.OutOfMemoryError now when a factory's results cannot fit (`tensor.empty`'s check)."""
    nbytes = sum(math.prod(o.shape) * np.dtype(o.dtype).itemsize for o in outs if o is not None)
    if nbytes >= memory.CHECK_FROM and runtime.STATE.abstract is None:
        memory.check_alloc(nbytes)


def _new_tensor(lz: Lazy) -> torch.Tensor:
    dt = _NP_TO_TORCH.get(lz.dtype) or _NP_TO_TORCH[np.dtype(lz.dtype)]
    t = _create_empty(lz.shape, dt)
    st = t.untyped_storage()
    st._tpu = lz
    TRACE.storages.append(weakref.ref(st))
    return t


def _write(t: torch.Tensor, value: Lazy) -> None:
    st = t.untyped_storage()
    base = st._tpu
    if type(base) is tt.Reinterpreted:
        raise DtypeView
    size, stride, off = tuple(t.shape), t.stride(), t.storage_offset()
    whole = off == 0 and t.is_contiguous() and math.prod(size) == math.prod(base.shape)
    if type(base) is tt.Uninit and not whole:  # (a whole write needs none of the old value)
        base = TRACE.zeros_for(st)
    ref = ("n", value.node, value.index)
    if whole and tuple(base.shape) == size:
        new = value
    elif whole:
        (new,) = TRACE.add(_reshape_fn(tuple(base.shape)), ("reshape", tuple(base.shape)), ((ref,),), [KIND_T], {}, {},
                           (tuple(base.shape), value.dtype))
    else:
        bref = TRACE._ref(base)
        if off and bref[0] == "x":  # (into a stored array at an offset: an input, as a read's in storage_ref)
            (new,) = TRACE.add(_write_at_fn(tuple(base.shape), size, tuple(stride)),
                               ("write@", tuple(base.shape), size, tuple(stride)), ((bref,), (ref,), TRACE._ext(off)),
                               [KIND_T, KIND_T, KIND_D], {}, {}, (tuple(base.shape), base.dtype))
        else:
            fn = _write_fn(tuple(base.shape), size, tuple(stride), off)
            (new,) = TRACE.add(fn, ("write", tuple(base.shape), size, tuple(stride), off), ((bref,), (ref,)),
                               [KIND_T, KIND_T], {}, {}, (tuple(base.shape), base.dtype))
    TRACE.undo.append((st, st._tpu))
    st._tpu = new  # (the version counter was bumped above the dispatch mode, as for any in-place op)
    TRACE.storages.append(weakref.ref(st))


# ---- turning the mode on and off ---------------------------------------------------------------------

_mode: FuseMode | None = None


def materialize(t: torch.Tensor, reason: str = "read") -> None:
    """Make sure tpu tensor `t` holds a concrete JAX array (flushing the trace if it is pending)."""
    base = getattr(t.untyped_storage(), "_tpu", None)
    if isinstance(base, Lazy):
        t.untyped_storage()._tpu = base.force(reason)


def flush(reason: str = "explicit") -> None:
    """Run everything deferred so far (no-op when nothing is pending)."""
    TRACE.flush(reason)


def _install_print_materialize() -> None:
    """Printing a tensor runs its formatting ops with dispatch modes disabled (`torch._tensor_str._str`), so a
    pending Fused value would reach the Strict kernels unforced: force it first (installed once)."""
    import torch._tensor_str as tensor_str

    original = tensor_str._str
    if getattr(original, "_tputool", False):
        return

    def _str(self, *, tensor_contents=None):
        if _mode is not None and self.device.type == "tpu" and self.layout is _STRIDED:  # (sparse: its parts are)
            materialize(self, "print")
        return original(self, tensor_contents=tensor_contents)

    _str._tputool = True
    _str.__wrapped__ = original
    tensor_str._str = _str


VALUES_ONLY = {
    "linalg_svdvals": lambda A, driver=None: aten._linalg_svd(A, False, False, driver=driver)[1],
    "linalg_eigvalsh": lambda A, UPLO="L": aten._linalg_eigh(A, UPLO, False)[0],
}
"""Composite ops that ask for their gradient-capable form (U and V, eigenvectors: run on the CPU) whenever a
dispatch mode is active, as Fused's is (ATen's `_may_require_fw_or_bw_grad` counts a mode as a tensor
subclass): name -> the values-only call they make without a mode, used while no gradient can be asked for."""

_values_only_lib: list = []


def _install_values_only() -> None:
    """Give VALUES_ONLY's ops a tpu autograd kernel that calls the values-only form when no gradient can be
    needed (grad mode off or an input without requires_grad, no forward-mode AD) and the composite otherwise."""
    if _values_only_lib:
        return
    import torch.autograd.forward_ad as fwad

    lib = torch.library.Library("aten", "IMPL")
    _values_only_lib.append(lib)
    for name, values in VALUES_ONLY.items():
        op = getattr(aten, name).default

        def kernel(A, *args, _op=op, _values=values, **kwargs):  # noqa: N803 - ATen's argument name
            if (A.requires_grad and torch.is_grad_enabled()) or fwad._current_level >= 0:
                return _op.decompose(A, *args, **kwargs)
            return _values(A, *args, **kwargs)

        lib.impl(name, kernel, "AutogradPrivateUse1")


def _on_mode_change(old: runtime.EagerMode, new: runtime.EagerMode) -> None:
    global _mode
    fused = runtime.EagerMode.DEFER_AND_FUSE
    if new is fused and _mode is None:
        _install_print_materialize()
        _install_values_only()
        if _seen_tensor:  # (else the first tpu tensor enters the mode: `_first_tensor`)
            _enter()
    elif new is not fused and _mode is not None:
        TRACE.flush("mode change")
        _pop_mode()
        _mode = None


def _enter() -> None:
    global _mode
    _mode = FuseMode()
    _push_mode(_mode)


_CREATE_SITES = ("tensor", "dispatch")
"""The backend modules whose `_create` makes every new tpu tensor outside Fused mode's own recording."""
_seen_tensor = False


def _first_tensor(*args, **kwargs) -> torch.Tensor:
    """`_create` until the process's first tpu tensor: then Fused mode's dispatch mode is entered (when it is the
    mode) and `_create` is PyTorch's again. A dispatch mode sees every op, a CPU tensor's too (a Python call each,
    ~4x a small CPU op): a process that never makes a tpu tensor never pays it."""
    global _seen_tensor
    _seen_tensor = True
    for name in _CREATE_SITES:
        sys.modules[f"tputool.backend.{name}"]._create = _create_empty
    t = _create_empty(*args, **kwargs)
    if runtime.STATE.mode is runtime.EagerMode.DEFER_AND_FUSE and _mode is None:
        _enter()
    return t


def _watch_for_the_first_tensor() -> None:
    from tputool.backend import dispatch, tensor  # noqa: F401 - (the modules in _CREATE_SITES)

    for name in _CREATE_SITES:
        sys.modules[f"tputool.backend.{name}"]._create = _first_tensor


def leave_in_forked_child() -> None:
    """Turn Fused mode off in a child forked after JAX started, without running the parent's pending trace: the
    child's tpu ops then reach the fork guard's refusal (tputool.backend.fork) instead of being recorded."""
    global _mode
    if _mode is not None:
        TRACE.reset()
        _pop_mode()
        _mode = None
    runtime.STATE.mode = runtime.EagerMode.DEFER_NEVER


def _after_optimizer_step(optimizer, args, kwargs) -> None:  # noqa: ANN001 - torch hook signature
    if _mode is not None:
        TRACE.flush("optimizer step")


_watch_for_the_first_tensor()
runtime.set_fuse_hook(_on_mode_change)
from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

register_optimizer_step_post_hook(_after_optimizer_step)
