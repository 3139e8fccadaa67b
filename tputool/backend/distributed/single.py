"""The world-size-1 group: every collective over one rank is the identity or a copy (no JAX runtime needed)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future


def done(result: object = None) -> dist.Work:
    """A Work already completed with `result` (its future holds it; DDP's Reducer reads the future)."""
    fut: Future = Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    if dst is not src:
        dst.copy_(src)


class NamedProcessGroup(dist.ProcessGroup):
    """A Python ProcessGroup that keeps the name torch.distributed gives it (DeviceMesh, FSDP2 and the
    functional collectives look groups up by name; a Python subclass has none of its own)."""

    _group_name: str | None = None

    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    supports_splitting = False
    """(as a c10d backend: no communicator to split; DeviceMesh and new_group make subgroups of their own)"""

    def _get_backend(self, device: torch.device) -> NamedProcessGroup:
        """The backend serving `device`: this group itself, which runs every device's collectives (torch asks
        for it when `init_process_group(device_id=...)` binds a device, as nanochat's does)."""
        return self

    @property
    def bound_device_id(self) -> None:
        """None: no communicator is bound to one device, whatever `init_process_group(device_id=...)` asked (torch's
        subgroups then come from `new_group`, never from a split)."""
        return None

    @bound_device_id.setter
    def bound_device_id(self, device: torch.device | None) -> None:
        pass

    @property
    def group_name(self) -> str:
        """The name torch.distributed registered this group under."""
        if self._group_name is None:
            raise RuntimeError("tpu process group: no name set yet (torch.distributed names a group when it "
                               "creates it)")
        return self._group_name


class SingleRankProcessGroup(NamedProcessGroup):
    """A ProcessGroup of one rank: collectives complete at once, leaving each tensor as one rank's result."""

    def __init__(self, name: str) -> None:
        super().__init__(0, 1)
        self._name = name

    def getBackendName(self) -> str:  # noqa: N802 - torch's API name
        """The registered backend name this group was created under."""
        return self._name

    def size(self) -> int:
        """World size: always 1."""
        return 1

    def rank(self) -> int:
        """This process's rank: always 0."""
        return 0

    def allreduce(self, tensors: Sequence[torch.Tensor], opts: object = None) -> dist.Work:
        """Sum/avg/min/max/product over one rank: the tensors unchanged."""
        return done(list(tensors))

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], opts: object = None) -> dist.Work:
        """As allreduce, for a list of tensors."""
        return done(list(tensors))

    def broadcast(self, tensors: Sequence[torch.Tensor], opts: object = None) -> dist.Work:
        """Rank 0 is the only source: the tensors unchanged."""
        return done(list(tensors))

    def barrier(self, opts: object = None) -> dist.Work:
        """Nothing to wait for."""
        return done()

    def allgather(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                  opts: object = None) -> dist.Work:
        """outputs[i][0] <- inputs[i]."""
        for out, inp in zip(outputs, inputs, strict=True):
            _copy_into(out[0], inp)
        return done(list(outputs))


    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: object = None) -> dist.Work:
        """The gathered tensor of one rank is its input."""
        _copy_into(output.view(input.shape), input)
        return done([output])


    def reduce_scatter(self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]],
                       opts: object = None) -> dist.Work:
        """outputs[i] <- inputs[i][0]."""
        for out, inp in zip(outputs, inputs, strict=True):
            _copy_into(out, inp[0])
        return done(list(outputs))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: object = None) -> dist.Work:
        """One rank's shard is the whole input."""
        _copy_into(output, input.view(output.shape))
        return done([output])

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                 opts: object = None) -> dist.Work:
        """outputs[0] <- inputs[0]."""
        for out, inp in zip(outputs, inputs, strict=True):
            _copy_into(out, inp)
        return done(list(outputs))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int] | None,
                          input_split_sizes: list[int] | None, opts: object = None) -> dist.Work:
        """All data stays on rank 0."""
        _copy_into(output, input)
        return done([output])

    def gather(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
               opts: object = None) -> dist.Work:
        """outputs[i][0] <- inputs[i] (rank 0 is the destination)."""
        return self.allgather(outputs, inputs)

    def scatter(self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]],
                opts: object = None) -> dist.Work:
        """outputs[i] <- inputs[i][0] (rank 0 is the source)."""
        return self.reduce_scatter(outputs, inputs)

    def allgather_coalesced(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                            opts: object = None) -> dist.Work:
        """As allgather, for a list of tensors."""
        return self.allgather(outputs, inputs)

    def all_gather_single_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                    opts: object = None) -> dist.Work:
        """As all_gather_single, for lists of tensors."""
        for out, inp in zip(outputs, inputs, strict=True):
            self.all_gather_single(out, inp)
        return done(list(outputs))

    def reduce_scatter_single_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                        opts: object = None) -> dist.Work:
        """As reduce_scatter_single, for lists of tensors."""
        for out, inp in zip(outputs, inputs, strict=True):
            self.reduce_scatter_single(out, inp)
        return done(list(outputs))

    def reduce(self, tensors: Sequence[torch.Tensor], opts: object = None) -> dist.Work:
        """Reduce to rank 0: the tensors unchanged."""
        return done(list(tensors))
