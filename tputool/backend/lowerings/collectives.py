"""Traced-only lowerings of the functional collectives (`_c10d_functional.*`: what `torch.distributed.
_functional_collectives`, DTensor and FSDP2 emit, and what torch.compile graphs hold), for groups of one rank.

Over one rank every collective is the identity: all_reduce of any op, all_gather and reduce_scatter with a
group size of 1, all_to_all_single, and `wait_tensor`. Eager mode never runs these (registered
`traced_only`): there the ops run PyTorch's kernels, which call the tpu process group. A group of more than
one rank cannot be lowered into the computation: its collectives go through the process group
(`graph/collectives.py` splits a compiled graph around them, Fused mode runs them eagerly), so these
lowerings refuse them with `Unsupported`.
"""

from __future__ import annotations

import torch

from tputool.backend.lowerings import Unsupported, lowering

c10d = torch.ops._c10d_functional


def group_size(group_name: str) -> int:
    """Ranks in the process group registered as `group_name` (torch.distributed's group registry)."""
    from torch._C._distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name).size()


def _one_rank(size: int, what: str) -> None:
    if size != 1:
        raise Unsupported(f"{what} over {size} ranks goes through the process group, not inside a computation")


@lowering(c10d.wait_tensor.default, traced_only=True)
def wait_tensor(x):
    return x


@lowering(c10d.all_reduce.default, traced_only=True)
def all_reduce(x, reduce_op, group_name):
    _one_rank(group_size(group_name), "all_reduce")
    return x


@lowering(c10d.all_reduce_coalesced.default, traced_only=True)
def all_reduce_coalesced(xs, reduce_op, group_name):
    _one_rank(group_size(group_name), "all_reduce_coalesced")
    return list(xs)


@lowering(c10d.all_gather_into_tensor.default, traced_only=True)
def all_gather_into_tensor(x, size, group_name):
    _one_rank(size, "all_gather_into_tensor")
    return x


@lowering(c10d.all_gather_into_tensor_coalesced.default, traced_only=True)
def all_gather_into_tensor_coalesced(xs, size, group_name):
    _one_rank(size, "all_gather_into_tensor_coalesced")
    return list(xs)


@lowering(c10d.reduce_scatter_tensor.default, traced_only=True)
def reduce_scatter_tensor(x, reduce_op, size, group_name):
    _one_rank(size, "reduce_scatter_tensor")
    return x


@lowering(c10d.reduce_scatter_tensor_coalesced.default, traced_only=True)
def reduce_scatter_tensor_coalesced(xs, reduce_op, size, group_name):
    _one_rank(size, "reduce_scatter_tensor_coalesced")
    return list(xs)


@lowering(c10d.all_to_all_single.default, traced_only=True)
def all_to_all_single(x, output_split_sizes, input_split_sizes, group_name):
    _one_rank(group_size(group_name), "all_to_all_single")
    return x
