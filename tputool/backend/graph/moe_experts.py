"""The sparse mixture-of-experts expert layer over JAX arrays: the one place `torch.tpu.ops.moe_experts`, the MoE
model's sparse dispatch and the tuner get it from.

`experts(x, top_w, top_i, w1, w3, w2, impl=...)`: x (..., dim) tokens, each routed to the experts `top_i`
(..., k) with weights `top_w` (..., k); the (token, k) assignments are sorted by expert, their rows gathered,
the three SwiGLU expert matmuls run as grouped matmuls of implementation `impl` (`grouped_matmul.py`:
`ragged`, or the Pallas megablox `gmm`), and the rows are summed back into their tokens with their weights.
Only the group sizes depend on the routing, so shapes stay static.

On a mesh the layer runs per device under `jax.shard_map` (XLA cannot partition a Pallas kernel, and a global
sort would gather every token): each device routes, sorts and groups its own tokens (the leading batch axis
split over the batch axes and the sequence axis over `tensor`, each where the mesh divides it, replicated
otherwise), with the expert weights whole inside the map (XLA gathers sharded weights before it, as FSDP does); group sizes are then per device. The
mesh is the one `on_mesh` names while the layer is traced (the tuner's step), else the active tuned config's
(`runtime.STATE.moe_mesh`, set by its `shard_model`); none, or one device: the whole batch at once.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp

from tputool.backend import runtime
from tputool.backend.graph.grouped_matmul import grouped_matmul

_MESH: contextvars.ContextVar = contextvars.ContextVar("tputool_moe_mesh", default=None)


@contextlib.contextmanager
def on_mesh(mesh) -> Iterator[None]:
    """Expert layers traced inside run per device of `mesh` (None: the runtime's mesh, if any)."""
    token = _MESH.set(mesh)
    try:
        yield
    finally:
        _MESH.reset(token)


def current_mesh():
    """The mesh expert layers traced now run per device of: `on_mesh`'s, else `runtime.STATE.moe_mesh`."""
    mesh = _MESH.get()
    return mesh if mesh is not None else runtime.STATE.moe_mesh


def one_device(x, top_w, top_i, w1, w3, w2, impl: str):
    """The expert layer over all of `x`'s tokens at once (see the module docstring)."""
    matmul = grouped_matmul(impl)
    dim, k = x.shape[-1], top_i.shape[-1]
    xf = x.reshape(-1, dim)
    assigned = top_i.reshape(-1)
    order = jnp.argsort(assigned, stable=True)
    token = order // k
    rows = xf[token]
    sizes = jnp.bincount(assigned, length=w1.shape[0])
    h = jax.nn.silu(matmul(rows, w1, sizes)) * matmul(rows, w3, sizes)
    y = matmul(h, w2, sizes)
    y = y * top_w.reshape(-1)[order][:, None].astype(y.dtype)
    return jnp.zeros(xf.shape, y.dtype).at[token].add(y).reshape(x.shape)


def per_device(fn: Callable, mesh, batch_axes: tuple[str, ...], seq_axes: tuple[str, ...]) -> Callable:
    """`fn(x, top_w, top_i, w1, w3, w2)` run per device of `mesh` under `jax.shard_map`: the leading (batch)
    axis of x, top_w and top_i split over `batch_axes` and the next (sequence) axis, when x has one, over
    `seq_axes`, each where the mesh divides it (replicated otherwise); the weights whole on every device."""
    from jax.sharding import PartitionSpec as P

    def split(axes: tuple[str, ...], size: int):
        axes = tuple(a for a in axes if mesh.shape.get(a, 1) > 1)
        return axes if axes and size % math.prod(mesh.shape[a] for a in axes) == 0 else None

    def run(x, top_w, top_i, w1, w3, w2):
        tokens = P(split(batch_axes, x.shape[0]), *([split(seq_axes, x.shape[1])] if x.ndim > 2 else []))
        return jax.shard_map(fn, mesh=mesh, in_specs=(tokens, tokens, tokens, P(), P(), P()),
                             out_specs=tokens, check_vma=False)(x, top_w, top_i, w1, w3, w2)

    return run


def experts(x, top_w, top_i, w1, w3, w2, *, impl: str):
    """The sparse expert layer with grouped matmuls `impl`, per device of `current_mesh()` when it has more
    than one device: the function `torch.tpu.ops.moe_experts` hands jax_op."""
    from tputool.partition import BATCH_AXES

    def fn(x, top_w, top_i, w1, w3, w2):
        return one_device(x, top_w, top_i, w1, w3, w2, impl)

    mesh = current_mesh()
    if mesh is not None and mesh.size > 1:
        fn = per_device(fn, mesh, BATCH_AXES, ("tensor",))
    return fn(x, top_w, top_i, w1, w3, w2)
