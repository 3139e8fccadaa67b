"""Traced-only lowerings of the functional collectives (`_c10d_functional.*`: what `torch.distributed.
_functional_collectives`, DTensor and FSDP2 emit, and what torch.compile graphs hold).

Over one rank every collective is the identity: all_reduce of any op, all_gather and reduce_scatter with a
group size of 1, all_to_all_single, and `wait_tensor`. Eager mode never runs these (registered
`traced_only`): there the ops run PyTorch's kernels, which call the tpu process group. Over more ranks, a
collective is lowered to `jax.lax`'s collectives over the mesh axis `programs.AXIS` only while a whole graph
is traced inside `shard_map` over that group's devices (`over_group`, entered by `graph/collectives.Spmd`);
there an all_to_all_single of uneven splits is exchanged padded to its largest chunk, with the split matrix of
every rank (agreed on when the graph was compiled, `over_group`'s `splits`). Anywhere else (Fused mode, a graph
cut by `graph/collectives.split_compile`) these lowerings refuse it with `Unsupported` and the collective goes
through the process group.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from tputool.backend.lowerings import Unsupported, lowering

c10d = torch.ops._c10d_functional


def group_size(group_name: str) -> int:
    """Ranks in the process group registered as `group_name` (torch.distributed's group registry)."""
    from torch._C._distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name).size()


_TRACED_GROUP: dict[str, int] = {}
"""The group whose collectives lower to the mesh axis while a graph is traced in `shard_map` (name -> ranks)."""

Splits = tuple[tuple[int, ...], ...]
"""An all_to_all's split matrix: [i][j] rows go from rank i to rank j."""

_SPLITS: dict[str, tuple[int, Iterator[Splits], list]] = {}
"""While a graph is traced over group name: (this process's rank, the split matrix of each all_to_all_single, in
graph order, the arrays to keep alive: see `over_group`)."""


def is_uneven(rows: Splits) -> bool:
    """True when an all_to_all's split matrix does not send the same number of rows between every two ranks."""
    return len({k for row in rows for k in row}) > 1


@contextlib.contextmanager
def over_group(name: str, size: int, rank: int = 0, splits: Sequence[Splits] = ()) -> Iterator[list]:
    """Lower the collectives of group `name` (of `size` ranks) to `jax.lax` collectives over `programs.AXIS`;
    the graph's all_to_all_single nodes, in order, use `splits` (this process being `rank`).

    Yields a list that gets one small array per uneven all_to_all: the caller makes them outputs of the
    computation. (Each rank's program has its own shapes there; on a rank that receives no rows, XLA would
    otherwise drop the exchange as dead code, and the other ranks would wait for it.)"""
    kept: list = []
    _TRACED_GROUP[name] = size
    _SPLITS[name] = (rank, iter(splits), kept)
    try:
        yield kept
    finally:
        _TRACED_GROUP.pop(name, None)
        _SPLITS.pop(name, None)


def _one_rank(size: int, what: str, group_name: str = "") -> bool:
    """True over one rank (the identity); False over the traced group's ranks (lowered); else Unsupported."""
    if size == 1:
        return True
    if _TRACED_GROUP.get(group_name) == size:
        return False
    raise Unsupported(f"{what} over {size} ranks goes through the process group, not inside a computation")


def _reduce(x, reduce_op: str, size: int):
    from tputool.backend.distributed import programs

    return programs.reduce_block(x, reduce_op.upper(), size, None)


def _gather(x):
    from jax import lax

    from tputool.backend.distributed.programs import AXIS

    return lax.all_gather(x, AXIS, tiled=True)


def _scatter(x, reduce_op: str, size: int):
    from tputool.backend.distributed import programs

    return programs.reduce_scatter_block(x, reduce_op.upper(), size, None)


@lowering(c10d.wait_tensor.default, traced_only=True)
def wait_tensor(x):
    return x


@lowering(c10d.all_reduce.default, traced_only=True)
def all_reduce(x, reduce_op, group_name):
    n = group_size(group_name)
    return x if _one_rank(n, "all_reduce", group_name) else _reduce(x, reduce_op, n)


@lowering(c10d.all_reduce_coalesced.default, traced_only=True)
def all_reduce_coalesced(xs, reduce_op, group_name):
    n = group_size(group_name)
    return list(xs) if _one_rank(n, "all_reduce_coalesced", group_name) else [_reduce(x, reduce_op, n) for x in xs]


@lowering(c10d.all_gather_into_tensor.default, traced_only=True)
def all_gather_into_tensor(x, size, group_name):
    return x if _one_rank(size, "all_gather_into_tensor", group_name) else _gather(x)


@lowering(c10d.all_gather_into_tensor_coalesced.default, traced_only=True)
def all_gather_into_tensor_coalesced(xs, size, group_name):
    return list(xs) if _one_rank(size, "all_gather_into_tensor_coalesced", group_name) else [_gather(x) for x in xs]


@lowering(c10d.reduce_scatter_tensor.default, traced_only=True)
def reduce_scatter_tensor(x, reduce_op, size, group_name):
    return x if _one_rank(size, "reduce_scatter_tensor", group_name) else _scatter(x, reduce_op, size)


@lowering(c10d.reduce_scatter_tensor_coalesced.default, traced_only=True)
def reduce_scatter_tensor_coalesced(xs, reduce_op, size, group_name):
    if _one_rank(size, "reduce_scatter_tensor_coalesced", group_name):
        return list(xs)
    return [_scatter(x, reduce_op, size) for x in xs]


@lowering(c10d.all_to_all_single.default, traced_only=True)
def all_to_all_single(x, output_split_sizes, input_split_sizes, group_name):
    n = group_size(group_name)
    if _one_rank(n, "all_to_all_single", group_name):
        return x
    rank, splits, kept = _SPLITS[group_name]
    rows = next(splits, None)
    if rows is None:  # (a graph traced without the ranks' splits: only equal ones are known to agree)
        if not even_splits(x.shape[0], n, output_split_sizes, input_split_sizes):
            raise Unsupported("all_to_all_single with uneven splits goes through the process group")
        rows = ((x.shape[0] // n,) * n,) * n
    if is_uneven(rows):
        return _all_to_all_v(x, rows, rank, kept)
    from jax import lax

    from tputool.backend.distributed.programs import AXIS

    return lax.all_to_all(x, AXIS, 0, 0, tiled=True)


def _all_to_all_v(x, rows: Splits, rank: int, kept: list):
    """Rank `rank`'s result of an all_to_all of split matrix `rows`: every chunk padded to the largest one, the
    padded blocks (the same shape on every rank) exchanged, then this rank's received rows picked out (a row of
    the exchanged block goes to `kept`)."""
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    from tputool.backend.distributed.programs import AXIS

    n, m = len(rows), max(1, max(max(r) for r in rows))
    send = np.full(n * m, x.shape[0], np.int32)  # (index x.shape[0]: a row of zeros)
    off = 0
    for j, k in enumerate(rows[rank]):
        send[j * m:j * m + k] = np.arange(off, off + k)
        off += k
    padded = jnp.concatenate([x, jnp.zeros((1, *x.shape[1:]), x.dtype)])[send]
    got = lax.all_to_all(padded, AXIS, 0, 0, tiled=True)  # (chunk j: what rank j sent here, padded)
    kept.append(got[:1])
    return got[np.concatenate([np.arange(j * m, j * m + rows[j][rank]) for j in range(n)]).astype(np.int32)]


def even_splits(rows: int, n: int, *splits) -> bool:
    """True when every split list of an all_to_all over `n` ranks is absent or `rows` cut in `n` equal parts."""
    return all(not s or (len(s) == n and all(int(k) * n == rows for k in s)) for s in splits)
