"""`jax_op` inside `torch.compile`: the custom ops `tputool::jax_op` / `tputool::jax_op_vjp`, lowered by calling
the user's function in the compiled graph's own JAX computation (no graph break, no extra dispatch).

Dynamo cannot trace JAX, so `pallas.jax_op`, while Dynamo traces it, calls `describe` (run for real at trace
time, its result a constant): it registers (fn, static arguments) under an integer key, with the output
structure for the input shapes; the graph then holds `tputool::jax_op(inputs, key)`. Its fake kernel takes
shapes from `jax.eval_shape`; its backward is `tputool::jax_op_vjp(inputs, cotangents, key)`, the VJP of fn
recomputed from the inputs (inside one compiled backward, XLA schedules the recomputation). Registered on the
first compiled call of jax_op (custom ops cost milliseconds to define). Shapes must be static.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from tputool.backend import dtypes, events
from tputool.backend.lowerings import lowering
from tputool.backend.tpu_api import _bridge

_entries: list[tuple[Callable, dict]] = []
_keys: dict = {}


def _avals(inputs: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(tuple(t.shape), dtypes.to_np(t.dtype)) for t in inputs]


def _fn(key: int) -> Callable:
    fn, static = _entries[key]
    return functools.partial(fn, **static) if static else fn


def _inexact(dtype: Any) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


def _structure(tree: Any) -> Any:
    """fn's output structure as plain Python (Dynamo folds it): a leaf's index, or a (kind, items) pair."""
    counter = iter(range(1 << 30))

    def walk(x: Any) -> Any:
        if isinstance(x, tuple | list):
            return ("tuple" if isinstance(x, tuple) else "list", tuple(walk(v) for v in x))
        if isinstance(x, dict):
            return ("dict", tuple((k, walk(x[k])) for k in sorted(x)))
        return next(counter)

    return walk(tree)


def build(structure: Any, outs: Sequence[torch.Tensor]) -> Any:
    """fn's outputs in its structure (pure Python: Dynamo traces it)."""
    if isinstance(structure, int):
        return outs[structure]
    kind, items = structure
    if kind == "dict":
        return {k: build(s, outs) for k, s in items}
    vals = [build(s, outs) for s in items]
    return tuple(vals) if kind == "tuple" else vals


@torch.compiler.disable
def _describe_now(fn: Callable, static_items: tuple, shapes: tuple) -> tuple[int, Any]:
    """(key, output structure) of fn with static arguments for inputs of `shapes` ((shape, dtype) pairs)."""
    static = dict(static_items)
    k = (fn, static_items)
    key = _keys.get(k)
    if key is None:
        key = _keys[k] = len(_entries)
        _entries.append((fn, static))
    avals = [jax.ShapeDtypeStruct(tuple(s), dtypes.to_np(d)) for s, d in shapes]
    return key, _structure(jax.eval_shape(_fn(key), *avals))


@torch._dynamo.assume_constant_result
def describe(fn: Callable, static_items: tuple, shapes: tuple) -> tuple[int, Any]:
    """`_describe_now`: Dynamo runs it while tracing and keeps the result as a constant, when the shapes are
    static. With dynamic sizes it cannot, and traces this body instead: then it must not trace JAX, so the
    call is a graph break (run with the real sizes; the op after it is traced as usual)."""
    return _describe_now(fn, static_items, shapes)


@torch.library.custom_op("tputool::jax_op", mutates_args=())
def jax_op_graph(inputs: list[torch.Tensor], key: int) -> list[torch.Tensor]:
    """fn(*inputs) of entry `key`, flattened (eager kernel: tpu tensors)."""
    from tputool.backend.tpu_api.pallas import _compiled

    fn, static = _entries[key]
    arrs = _bridge.arrays(inputs, "torch.tpu.pallas.jax_op")
    events.launches += 1
    return [_bridge.tensor(a) for a in jax.tree_util.tree_leaves(_compiled(fn, static).call(*arrs))]


@jax_op_graph.register_fake
def _jax_op_fake(inputs, key):
    out = jax.tree_util.tree_leaves(jax.eval_shape(_fn(key), *_avals(inputs)))
    dev = inputs[0].device if inputs else torch.device("tpu")
    return [torch.empty(a.shape, dtype=dtypes.NP_TO_TORCH[np.dtype(a.dtype)], device=dev) for a in out]


def _vjp(inputs: Sequence[Any], cts: Sequence[Any], key: int) -> list:
    f = _fn(key)
    out, pull = jax.vjp(f, *inputs)
    leaves, treedef = jax.tree_util.tree_flatten(out)
    cts = [c.astype(o.dtype) if _inexact(o.dtype) else np.zeros(o.shape, jax.dtypes.float0)
           for c, o in zip(cts, leaves, strict=True)]
    grads = pull(jax.tree_util.tree_unflatten(treedef, cts))
    return [g for g, x in zip(grads, inputs, strict=True) if _inexact(x.dtype)]


_vjp_jit = jax.jit(_vjp, static_argnums=2)


@torch.library.custom_op("tputool::jax_op_vjp", mutates_args=())
def jax_op_vjp(inputs: list[torch.Tensor], cotangents: list[torch.Tensor], key: int) -> list[torch.Tensor]:
    """Gradients of entry `key`'s floating inputs for `cotangents` of its outputs (eager kernel: tpu tensors)."""
    arrs = _bridge.arrays([*inputs, *cotangents], "torch.tpu.pallas.jax_op backward")
    n = len(inputs)
    events.launches += 1
    return [_bridge.tensor(a) for a in _vjp_jit(arrs[:n], arrs[n:], key)]


@jax_op_vjp.register_fake
def _jax_op_vjp_fake(inputs, cotangents, key):
    return [torch.empty_like(t) for t in inputs if t.dtype.is_floating_point or t.dtype.is_complex]


def _setup_context(ctx, inputs, output) -> None:
    ins, key = inputs
    ctx.save_for_backward(*ins)
    ctx.key = key
    ctx.diff = [t.dtype.is_floating_point or t.dtype.is_complex for t in ins]
    ctx.outs = [(tuple(o.shape), o.dtype) for o in output]


def _backward(ctx, grads):
    ins = ctx.saved_tensors
    cts = [g if g is not None else torch.zeros(s, dtype=d, device=ins[0].device)
           for g, (s, d) in zip(grads, ctx.outs, strict=True)]
    it = iter(jax_op_vjp(list(ins), cts, ctx.key))
    return [next(it) if d else None for d in ctx.diff], None


jax_op_graph.register_autograd(_backward, setup_context=_setup_context)


def _lower_jax_op(inputs, key):
    return jax.tree_util.tree_leaves(_fn(key)(*inputs))


lowering(torch.ops.tputool.jax_op.default, static_scalars=True, traced_only=True)(_lower_jax_op)
lowering(torch.ops.tputool.jax_op_vjp.default, static_scalars=True, traced_only=True)(_vjp)
