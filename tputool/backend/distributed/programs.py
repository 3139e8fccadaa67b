"""Collectives as jitted `shard_map` programs over a group's devices (one device per process), built once.

`program(devices, kind, shape, dtype, *params)` returns a cached `Collective`: called with this process's
local arrays (blocks of at least one dimension), it assembles the global arrays (the processes' blocks side
by side along dimension 0), runs the one compiled program every member runs, and returns this process's
local results. Bodies see one rank's block and the mesh axis "r".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tputool import mesh as meshes

AXIS = "r"
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}
GATHERED = ("PRODUCT", "BAND", "BOR", "BXOR")
"""Reductions with no collective primitive: all-gathered, then reduced on each rank."""
_COMBINE = {"PRODUCT": jnp.multiply, "BAND": jnp.bitwise_and, "BOR": jnp.bitwise_or, "BXOR": jnp.bitwise_xor,
            "MIN": jnp.minimum, "MAX": jnp.maximum, "SUM": jnp.add}


class Collective:
    """One compiled collective: local blocks in, local results out (see the module docstring)."""

    __slots__ = ("_fn", "_global", "_sharding")

    def __init__(self, mesh, body: Callable, shapes: Sequence[tuple], replicated: Sequence[bool]) -> None:
        n = mesh.devices.size
        self._sharding = NamedSharding(mesh, P(AXIS))
        self._global = [(n * s[0], *s[1:]) for s in shapes]
        out_specs = tuple(P() if r else P(AXIS) for r in replicated)
        self._fn = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(AXIS),) * len(shapes),
                                         out_specs=out_specs, check_vma=False))

    def launch(self, *blocks: jax.Array) -> list[jax.Array]:
        """Dispatch the collective over this process's `blocks`: the global results, not waited for."""
        make = jax.make_array_from_single_device_arrays
        return self._fn(*[make(g, self._sharding, [b]) for g, b in zip(self._global, blocks, strict=True)])

    @staticmethod
    def local(outs: list[jax.Array]) -> list[jax.Array]:
        """This process's blocks of the global results `outs`."""
        return [o.addressable_shards[0].data for o in outs]

    def __call__(self, *blocks: jax.Array) -> list[jax.Array]:
        """This process's results of the collective over its `blocks`, waited for (see `faults.Guard.run` for
        the wait a group uses: bounded, and a failure named)."""
        outs = self.launch(*blocks)
        # Wait for it: the inputs' buffers are shared with arrays a Fused flush may donate (delete) next; an
        # asynchronous collective still reading them then fails ("deleted or donated buffer").
        jax.block_until_ready(outs)
        return self.local(outs)


@functools.cache
def group_mesh(devices: tuple):
    """The one-axis (`AXIS`) mesh over `devices`, one per rank in group order (cached)."""
    return meshes.build_mesh((len(devices),), (AXIS,), devices, topology=False)


def _pick(a: jax.Array, keep) -> jax.Array:
    """The block of the rank where `keep` holds, on every rank, bit for bit (an all-reduce of masked bits)."""
    if a.dtype == jnp.bool_:
        return lax.pmax(jnp.where(keep, a, False).astype(jnp.uint8), AXIS).astype(jnp.bool_)
    if jnp.issubdtype(a.dtype, jnp.complexfloating):
        return lax.complex(_pick(jnp.real(a), keep), _pick(jnp.imag(a), keep))
    u = lax.bitcast_convert_type(a, _UINT[a.dtype.itemsize])
    s = lax.psum(jnp.where(keep, u, jnp.zeros_like(u)), AXIS)
    return lax.bitcast_convert_type(s, a.dtype)


def reduce_block(a: jax.Array, op: str, n: int, factor: float | None) -> jax.Array:
    """All-reduce of block `a` with torch's ReduceOp named `op`."""
    if a.dtype == jnp.bool_:
        kind = {"SUM": "MAX", "PRODUCT": "MIN", "BOR": "MAX", "BAND": "MIN"}.get(op, op)
        return reduce_block(a.astype(jnp.uint8), kind, n, factor).astype(jnp.bool_)
    if op == "SUM":
        return lax.psum(a, AXIS)
    if op == "AVG":
        s = lax.psum(a, AXIS)
        return s // n if jnp.issubdtype(a.dtype, jnp.integer) else (s / n).astype(a.dtype)
    if op == "PREMUL_SUM":
        return lax.psum(a * jnp.asarray(factor, a.dtype), AXIS)
    if op == "MAX":
        return lax.pmax(a, AXIS)
    if op == "MIN":
        return lax.pmin(a, AXIS)
    g = lax.all_gather(a, AXIS)
    return functools.reduce(_COMBINE[op], [g[i] for i in range(n)])


def reduce_scatter_block(a: jax.Array, op: str, n: int, factor: float | None) -> jax.Array:
    """This rank's 1/n of the reduction over ranks of `a` (split along dimension 0)."""
    if op in ("SUM", "AVG", "PREMUL_SUM") and a.dtype != jnp.bool_:
        x = a * jnp.asarray(factor, a.dtype) if op == "PREMUL_SUM" else a
        s = lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True)
        if op != "AVG":
            return s
        return s // n if jnp.issubdtype(a.dtype, jnp.integer) else (s / n).astype(a.dtype)
    k = a.shape[0] // n
    parts = lax.all_to_all(a, AXIS, 0, 0, tiled=True).reshape((n, k, *a.shape[1:]))
    if a.dtype == jnp.bool_:
        kind = {"SUM": "BOR", "PRODUCT": "BAND", "MIN": "BAND", "MAX": "BOR"}.get(op, op)
        return functools.reduce(_COMBINE[kind], [parts[i] for i in range(n)])
    if op == "AVG":
        s = parts.sum(0, dtype=a.dtype)
        return s // n if jnp.issubdtype(a.dtype, jnp.integer) else (s / n).astype(a.dtype)
    return functools.reduce(_COMBINE[op], [parts[i] for i in range(n)])


@functools.lru_cache(maxsize=1024)
def program(devices: tuple, kind: str, shape: tuple, dtype: np.dtype, *params) -> Collective:
    """The cached collective `kind` over `devices` for blocks of `shape`/`dtype` (params: see each kind)."""
    mesh = group_mesh(devices)
    n = len(devices)
    if kind == "all_reduce":  # params: op, factor
        op, factor = params
        return Collective(mesh, lambda a: (reduce_block(a, op, n, factor),), [shape], [False])
    if kind == "broadcast":  # params: src (group rank)
        (src,) = params
        return Collective(mesh, lambda a: (_pick(a, lax.axis_index(AXIS) == src),), [shape], [False])
    if kind == "all_gather":  # params: pieces (0: one tensor of n blocks, else that many outputs)
        (pieces,) = params

        def gather(a):
            g = lax.all_gather(a, AXIS, tiled=True)
            return tuple(jnp.split(g, n)) if pieces else (g,)

        return Collective(mesh, gather, [shape], [True] * (n if pieces else 1))
    if kind == "reduce_scatter":  # params: op, factor
        op, factor = params
        return Collective(mesh, lambda a: (reduce_scatter_block(a, op, n, factor),), [shape], [False])
    if kind == "all_to_all":  # params: none (equal splits along dimension 0)
        return Collective(mesh, lambda a: (lax.all_to_all(a, AXIS, 0, 0, tiled=True),), [shape], [False])
    if kind == "all_to_all_v":  # params: the split matrix (rows[i][j]: rows rank i sends to rank j)
        return _all_to_all_v(mesh, shape, params[0])
    if kind == "scatter":  # params: src; the block holds n equal parts on the source
        (src,) = params
        k = shape[0] // n

        def scatter(a):
            whole = _pick(a, lax.axis_index(AXIS) == src)
            return (lax.dynamic_slice_in_dim(whole, lax.axis_index(AXIS) * k, k, 0),)

        return Collective(mesh, scatter, [shape], [False])
    if kind == "send":  # on the 2-device mesh (source, destination)
        return Collective(mesh, lambda a: (lax.ppermute(a, AXIS, [(0, 1)]),), [shape], [False])
    raise ValueError(f"unknown collective {kind!r}")


def _all_to_all_v(mesh, shape: tuple, rows: tuple) -> Collective:
    """all_to_all with uneven splits: each rank's chunks padded to the largest chunk, exchanged, unpadded.

    `shape`: every rank's input block, padded to the longest input (rows beyond its own are ignored)."""
    n = len(rows)
    m = max(1, max(max(r) for r in rows))
    length = shape[0]
    out_len = max(1, max(sum(rows[i][j] for i in range(n)) for j in range(n)))
    send = np.full((n, n * m), length, np.int32)  # index `length`: a zero row
    recv = np.zeros((n, out_len), np.int32)
    for i in range(n):
        off = 0
        for j in range(n):
            send[i, j * m:j * m + rows[i][j]] = np.arange(off, off + rows[i][j])
            off += rows[i][j]
        pos = 0
        for j in range(n):
            recv[i, pos:pos + rows[j][i]] = np.arange(j * m, j * m + rows[j][i])
            pos += rows[j][i]

    def body(a):
        me = lax.axis_index(AXIS)
        padded = jnp.concatenate([a, jnp.zeros((1, *a.shape[1:]), a.dtype)])[jnp.asarray(send)[me]]
        got = lax.all_to_all(padded, AXIS, 0, 0, tiled=True)
        return (got[jnp.asarray(recv)[me]],)

    return Collective(mesh, body, [shape], [False])
