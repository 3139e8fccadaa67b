"""torch.distributed backends "tpu" and "tpu_dist" for the bundled tpu device.

World size 1 (`single.SingleRankProcessGroup`): every collective is the identity or a copy, no runtime needed.
World size N > 1 (`group.TpuProcessGroup`): one process per rank, as torchrun launches them; the first group
starts JAX's multi-process runtime (`jax_runtime.initialize`: jax.distributed, gloo between CPU processes,
ICI/DCN on TPU) and every collective runs as a cached jitted shard_map program over one device per process
(`programs`), after the ranks exchange its signature through the c10d store (`handshake`: a missing rank or
a different call is named in an error, never a hang). Devices beyond the first of a process are used inside
it through SPMD sharding (`tputool.backend.graph.sharding`).
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from tputool.backend.distributed.single import SingleRankProcessGroup

BACKEND_NAMES = ("tpu_dist", "tpu")
"""Registered names; the first is the default for the tpu device (as in TorchTPU)."""

DEFAULT_TIMEOUT = timedelta(minutes=30)
"""torch's default process-group timeout, used when none is given."""


def _creator(name: str):
    def create(store: dist.Store, rank: int, world_size: int, timeout: timedelta | None) -> dist.ProcessGroup:
        if world_size == 1:
            return SingleRankProcessGroup(name)
        from tputool.backend.distributed import jax_runtime
        from tputool.backend.distributed.group import TpuProcessGroup

        timeout = timeout or DEFAULT_TIMEOUT
        jax_runtime.initialize(store, rank, world_size, timeout)
        return TpuProcessGroup(name, store, rank, world_size, timeout)

    return create


def register() -> None:
    """Register "tpu_dist" (the default for the tpu device) and "tpu" with torch.distributed (idempotent); in a
    torchrun worker of several processes, arrange for JAX's runtime to start before JAX's backend."""
    if not dist.is_available():
        return
    for name in BACKEND_NAMES:
        if name not in dist.Backend.backend_list:
            dist.Backend.register_backend(name, _creator(name), devices=["tpu", "cpu"])
    from tputool.backend.distributed import ddp_stats, jax_runtime

    ddp_stats.install()
    jax_runtime.install_early_start()
