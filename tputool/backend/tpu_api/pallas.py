"""`torch.tpu.pallas`: call a JAX or Pallas function on tpu tensors (`jax_op`), and the mesh for Pallas kernels.

`jax_op(fn, *tensors, **static)` hands `fn` the tensors' JAX arrays (no copies: a tpu tensor's value is a JAX
array), runs it as one `jax.jit` computation (cached per function, static arguments and compiler options) and
returns its outputs as tpu tensors, in the same structure (one array, a tuple/list/dict of arrays). It is a
`torch.autograd.Function`: when an input needs a gradient the forward runs `jax.vjp(fn)` and keeps its
residuals, and the backward applies the VJP to the incoming gradients (integer inputs get no gradient).
In the Fused eager mode the inputs' pending values are computed first (a flush). Under
`torch.compile(backend="tpu")` it becomes one op of the graph, `tputool::jax_op`, whose lowering calls `fn`
inside the graph's own computation (`tpu_api/_graph_op.py`; dynamic sizes make it a graph break).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np
import torch

from tputool.backend import cache, events, runtime
from tputool.backend.tpu_api import _bridge

__all__ = ["get_pallas_mesh", "jax_op"]


class _Compiled:
    """The jitted forms of one (fn, static arguments, compiler options): plain, forward-with-VJP, backward.

    They reach `fn` through `ref` (a weak reference for plain functions), so the cache entry, weakly keyed
    by `fn`, goes away with it."""

    __slots__ = ("call", "fwd", "bwd")

    def __init__(self, ref: Callable[[], Callable], static: dict, options: dict | None) -> None:
        def f(*arrays):
            return ref()(*arrays, **static)

        jit = functools.partial(jax.jit, compiler_options=options)
        self.call = jit(f)
        self.fwd = jit(lambda *a: jax.vjp(f, *a))
        self.bwd = jit(lambda vjp, cts: vjp(cts))


_by_fn: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_by_fn_strong: dict = {}
"""Compiled forms per function, then per (static arguments, compiler options). Plain functions are weakly
keyed (a lambda made per call does not pile up, though it compiles per call: pass values as static keyword
arguments instead); bound methods (a new object on each access) and objects without weak references are
kept."""


def _compiled(fn: Callable, static: dict) -> _Compiled:
    opts = runtime.STATE.compiler_options
    try:
        key: Hashable = (tuple(sorted(static.items())), tuple(sorted(opts.items())))
        hash(key)
    except TypeError as e:
        raise TypeError(f"jax_op's keyword arguments are static (passed to fn as Python values, part of the "
                        f"compile key), so they must be hashable: {e}") from None
    table, ref = None, None
    if not inspect.ismethod(fn):
        try:
            table, ref = _by_fn.setdefault(fn, {}), weakref.ref(fn)
        except TypeError:  # not weakly referenceable
            pass
    if table is None:
        table, ref = _by_fn_strong.setdefault(fn, {}), (lambda: fn)
    c = table.get(key)
    if c is None:
        c = table[key] = _Compiled(ref, static, dict(opts) or None)
    return c


def _differentiable(dtype: Any) -> bool:
    return jax.numpy.issubdtype(dtype, jax.numpy.inexact)


class _JaxOp(torch.autograd.Function):
    """jax_op as an autograd Function: its outputs are the flattened leaves of fn's result."""

    @staticmethod
    def forward(ctx, compiled: _Compiled, box: list, *tensors: torch.Tensor):  # noqa: ANN205 - torch's API
        arrs = _bridge.arrays(tensors, "torch.tpu.pallas.jax_op")
        if any(ctx.needs_input_grad[2:]):
            out, ctx.vjp = cache.call(compiled.fwd, "torch.tpu.pallas.jax_op", *arrs)
        else:
            out, ctx.vjp = compiled.call(*arrs), None
            events.launches += 1
        leaves, treedef = jax.tree_util.tree_flatten(out)
        box.append(treedef)
        outs = tuple(_bridge.tensor(a) for a in leaves)
        ctx.compiled, ctx.treedef = compiled, treedef
        ctx.out_avals = [(a.shape, a.dtype) for a in leaves]
        ctx.in_diff = [_differentiable(a.dtype) for a in arrs]
        ctx.mark_non_differentiable(*(t for t, a in zip(outs, leaves, strict=True) if not _differentiable(a.dtype)))
        return outs

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):  # noqa: ANN205 - torch's API
        cts = []
        for g, (shape, dtype) in zip(grads, ctx.out_avals, strict=True):
            if not _differentiable(dtype):
                cts.append(np.zeros(shape, jax.dtypes.float0))
            elif g is None:
                cts.append(jax.numpy.zeros(shape, dtype))
            else:
                cts.append(_bridge.arrays([g], "torch.tpu.pallas.jax_op backward")[0].astype(dtype))
        in_cts = ctx.compiled.bwd(ctx.vjp, jax.tree_util.tree_unflatten(ctx.treedef, cts))
        events.launches += 1
        return (None, None, *(_bridge.tensor(c) if ok else None for c, ok in zip(in_cts, ctx.in_diff, strict=True)))


def jax_op(fn: Callable, *tensors: torch.Tensor, **static: Any) -> Any:
    """`fn(*arrays, **static)` on the JAX values of tpu `tensors`; its outputs as tpu tensors (differentiable)."""
    if torch.compiler.is_compiling():  # one op of the compiled or exported graph (see _graph_op)
        from tputool.backend.tpu_api import _graph_op

        shapes = tuple((tuple(t.shape), t.dtype) for t in tensors)
        key, structure = _graph_op.describe(fn, tuple(sorted(static.items())), shapes)
        return _graph_op.build(structure, torch.ops.tputool.jax_op(list(tensors), key))
    return _eager_jax_op(fn, tensors, static)


def _eager_jax_op(fn: Callable, tensors: tuple, static: dict) -> Any:
    _bridge.require_tpu(tensors, "torch.tpu.pallas.jax_op")
    compiled = _compiled(fn, static)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):  # no autograd node needed
        out = cache.call(compiled.call, "torch.tpu.pallas.jax_op", *_bridge.arrays(tensors, "torch.tpu.pallas.jax_op"))
        return jax.tree_util.tree_map(_bridge.tensor, out)
    box: list = []
    outs = _JaxOp.apply(compiled, box, *tensors)
    return jax.tree_util.tree_unflatten(box[0], list(outs))


_mesh: list = []


def get_pallas_mesh():
    """The 1-D mesh ("data") over every device, in topology order: where Pallas kernels are shard_mapped."""
    if not _mesh:
        import torch.tpu

        _mesh.append(torch.tpu.topology_aware_mesh())
    return _mesh[0]
