"""torch.distributed backends "tpu"/"tpu_dist": world-size-1 collectives, DDP, and a late multi-process start."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from tputool.backend import distributed


@pytest.fixture
def group():
    distributed.register()
    dist.init_process_group("tpu", store=dist.HashStore(), rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def test_names_registered_and_tpu_dist_is_the_device_default() -> None:
    distributed.register()
    assert {"tpu", "tpu_dist"} <= set(dist.Backend.backend_list)
    assert dist.Backend.default_device_backend_map["tpu"] == "tpu_dist"


def test_collectives_over_one_rank(group, dev: str) -> None:
    assert dist.get_backend() == "tpu" and dist.get_world_size() == 1 and dist.get_rank() == 0
    t = torch.arange(4.0, device=dev)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.barrier()
    torch.testing.assert_close(t.cpu(), torch.arange(4.0))
    gathered = [torch.zeros(4, device=dev)]
    dist.all_gather(gathered, t)
    torch.testing.assert_close(gathered[0].cpu(), torch.arange(4.0))
    flat = torch.zeros(4, device=dev)
    dist.all_gather_into_tensor(flat, t)
    torch.testing.assert_close(flat.cpu(), torch.arange(4.0))
    shard = torch.zeros(4, device=dev)
    dist.reduce_scatter_tensor(shard, t * 2)
    torch.testing.assert_close(shard.cpu(), torch.arange(4.0) * 2)
    assert dist.all_reduce(t, async_op=True).wait()


def test_ddp_gradients_match_the_plain_model(group, dev: str) -> None:
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    model = copy.deepcopy(ref).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    x = torch.randn(8, 5)
    ddp(x.to(dev)).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


def test_more_than_one_process_after_jax_started_says_to_init_first(tpu_device: str) -> None:
    """World size > 1 starts JAX's distributed runtime, which must come before JAX's backend: a process that
    already ran a tpu op is told to call init_process_group first (the multi-process groups themselves are
    tested in test_distributed_multiprocess.py)."""
    torch.zeros(1, device=tpu_device).cpu()
    create = distributed._creator("tpu")
    with pytest.raises(RuntimeError, match="before the first tpu op"):
        create(dist.HashStore(), 0, 2, None)
