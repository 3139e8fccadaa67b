"""DDP, FSDP2, DTensor, DistributedSampler, distributed checkpoint and functional collectives on the tpu device
with one rank (the "tpu" group), each against the same code on CPU tensors with torch's gloo group.

Multi-process runs of the same are in test_parallel_multiprocess.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tputool.backend import distributed
from tputool.models import MODELS

STEPS = 3
LOSS_TOL = {"rtol": 1e-4, "atol": 1e-5}
PARAM_TOL = {"rtol": 1e-3, "atol": 1e-3}


@contextmanager
def one_rank(dev: str) -> Iterator[None]:
    """A world of one rank for `dev`: gloo for CPU tensors, the tpu group for tpu tensors."""
    distributed.register()
    dist.init_process_group("gloo" if dev == "cpu" else "tpu", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert dist.group.WORLD.group_name  # DeviceMesh/FSDP2/funcol find groups by name
        yield
    finally:
        dist.destroy_process_group()


def _llama_steps(dev: str, wrap: Callable[[torch.nn.Module, str], torch.nn.Module]) -> tuple[list[float], dict[str, torch.Tensor]]:
    """STEPS AdamW steps of the tiny Llama on `dev`, wrapped by `wrap`: (losses, final weights on CPU)."""
    spec = MODELS["llama"]
    cfg = spec.config()
    torch.manual_seed(0)
    base = spec.build(cfg)
    x, y = spec.example_batch(cfg, 4, "cpu", torch.Generator().manual_seed(0))
    with one_rank(dev):
        model = wrap(copy.deepcopy(base).to(dev), dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad(set_to_none=True)
            loss = spec.loss_fn(model(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        state = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().cpu()
                 for k, v in model.state_dict().items()}
    return [float(v.cpu()) for v in losses], {k.removeprefix("module."): v for k, v in state.items()}


def _assert_same_training(cpu: tuple, tpu: tuple) -> None:
    torch.testing.assert_close(torch.tensor(tpu[0]), torch.tensor(cpu[0]), **LOSS_TOL)
    assert cpu[0][-1] < cpu[0][0]
    torch.testing.assert_close(tpu[1], cpu[1], **PARAM_TOL)


def _ddp(model: torch.nn.Module, dev: str) -> torch.nn.Module:
    return torch.nn.parallel.DistributedDataParallel(model)


def _fsdp2(model: torch.nn.Module, dev: str) -> torch.nn.Module:
    mesh = init_device_mesh(dev, (1,))
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def test_ddp_trains_the_llama_as_gloo_on_cpu(tpu_device: str) -> None:
    _assert_same_training(_llama_steps("cpu", _ddp), _llama_steps(tpu_device, _ddp))


def test_fsdp2_trains_the_llama_as_gloo_on_cpu(tpu_device: str) -> None:
    cpu = _llama_steps("cpu", _fsdp2)
    _assert_same_training(cpu, _llama_steps(tpu_device, _fsdp2))


def _dtensor_ops(dev: str) -> list[torch.Tensor]:
    x = torch.arange(24.0).view(4, 6)
    w = torch.linspace(-1, 1, 12).view(6, 2)
    with one_rank(dev):
        mesh = init_device_mesh(dev, (1,))
        d = distribute_tensor(x.to(dev), mesh, [Shard(0)])
        assert d.to_local().device.type == dev and d.placements == (Shard(0),)
        rep = d.redistribute(mesh, [Replicate()])
        col = rep.redistribute(mesh, [Shard(1)])
        y = torch.mm(d, distribute_tensor(w.to(dev), mesh, [Replicate()]))
        out = [rep.to_local(), col.full_tensor(), (col * 2 + 1).sum().full_tensor(), y.full_tensor(),
               y.redistribute(mesh, [Replicate()]).to_local().softmax(-1)]
        return [t.cpu() for t in out]


def test_distribute_tensor_and_redistribute(tpu_device: str) -> None:
    cpu = _dtensor_ops("cpu")
    torch.testing.assert_close(_dtensor_ops(tpu_device), cpu)


def test_distribute_tensor_and_redistribute_in_fused_mode(tpu_device: str) -> None:
    """DTensor's ops on its tpu local tensors are deferred like any other (not run unforced, past the mode)."""
    cpu = _dtensor_ops("cpu")
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE):
        fused = _dtensor_ops(tpu_device)
    torch.testing.assert_close(fused, cpu)


def test_distributed_sampler_feeds_the_device(tpu_device: str) -> None:
    ds = TensorDataset(torch.arange(10.0), torch.arange(10) % 3)

    def batches(dev: str) -> list[torch.Tensor]:
        with one_rank(dev):
            sampler = DistributedSampler(ds, shuffle=True, seed=3)
            sampler.set_epoch(1)
            return [(x.to(dev) * (y.to(dev) + 1)).cpu() for x, y in DataLoader(ds, batch_size=4, sampler=sampler)]

    cpu = batches("cpu")
    assert sorted(torch.cat(cpu).tolist()) != torch.arange(10.0).tolist()  # (the seed shuffles)
    torch.testing.assert_close(batches(tpu_device), cpu)


def _trained(dev: str, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    spec = MODELS["llama"]
    cfg = spec.config()
    torch.manual_seed(seed)
    model = spec.build(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = spec.example_batch(cfg, 2, "cpu", torch.Generator().manual_seed(seed))
    spec.loss_fn(model(x.to(dev)), y.to(dev)).backward()
    opt.step()
    return model, opt


def test_distributed_checkpoint_round_trip_of_model_and_optimizer(tpu_device: str, tmp_path) -> None:
    with one_rank(tpu_device):
        model, opt = _trained(tpu_device, 0)
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=tmp_path)
        fresh, fresh_opt = _trained(tpu_device, 1)  # (other weights and optimizer moments)
        msd2, osd2 = get_state_dict(fresh, fresh_opt)
        state = {"model": msd2, "optim": osd2}
        dcp.load(state, checkpoint_id=tmp_path)
        set_state_dict(fresh, fresh_opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        assert all(v.device.type == "tpu" for v in fresh.state_dict().values())
        want = {k: v.cpu() for k, v in model.state_dict().items()}
        torch.testing.assert_close({k: v.cpu() for k, v in fresh.state_dict().items()}, want, rtol=0, atol=0)
        for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
            for key in ("exp_avg", "exp_avg_sq", "step"):
                torch.testing.assert_close(fresh_opt.state[q][key].cpu(), opt.state[p][key].cpu(), rtol=0, atol=0)
    with one_rank("cpu"):  # the tpu checkpoint loads into a CPU model
        cpu_model, _ = _trained("cpu", 1)
        cpu_state = {"model": cpu_model.state_dict()}
        dcp.load(cpu_state, checkpoint_id=tmp_path)
        torch.testing.assert_close(cpu_state["model"], want, rtol=0, atol=0)


def test_distributed_checkpoint_of_fsdp2_dtensor_state(tpu_device: str, tmp_path) -> None:
    with one_rank(tpu_device):
        model = _fsdp2(_trained(tpu_device, 0)[0], tpu_device)
        sd = model.state_dict()
        assert all(isinstance(v, DTensor) for v in sd.values())
        dcp.save(sd, checkpoint_id=tmp_path)
        fresh = _fsdp2(_trained(tpu_device, 1)[0], tpu_device)
        loaded = fresh.state_dict()
        dcp.load(loaded, checkpoint_id=tmp_path)
        fresh.load_state_dict(loaded)
        torch.testing.assert_close({k: v.full_tensor().cpu() for k, v in fresh.state_dict().items()},
                                   {k: v.full_tensor().cpu() for k, v in sd.items()}, rtol=0, atol=0)


def _collectives(x: torch.Tensor) -> torch.Tensor:
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD
    y = funcol.all_reduce(x * 2, "sum", group)
    z = funcol.all_gather_tensor(y, 0, group)
    w = funcol.reduce_scatter_tensor(z + 1, "sum", 0, group)
    v = funcol.all_reduce(w, "max", group)
    return v.sum(0) + funcol.all_to_all_single(x, None, None, group)


def _compiled_collectives(dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(6.0).view(2, 3)
    with one_rank(dev):
        backend = "tpu" if dev != "cpu" else "aot_eager"
        torch._dynamo.reset()
        compiled = torch.compile(_collectives, backend=backend, fullgraph=True)
        return _collectives(x.to(dev)).cpu(), compiled(x.to(dev)).cpu()


def test_compiled_functional_collectives_lower_on_one_rank(tpu_device: str) -> None:
    from tputool.backend import events

    cpu_eager, cpu_compiled = _compiled_collectives("cpu")
    torch.testing.assert_close(cpu_compiled, cpu_eager)
    fallbacks = events.total("fallback")
    eager, compiled = _compiled_collectives(tpu_device)
    torch.testing.assert_close(eager, cpu_eager)
    torch.testing.assert_close(compiled, cpu_eager)
    assert events.total("fallback") == fallbacks


def test_the_device_a_process_selects_holds_its_tensors_in_a_multi_process_run(tpu_device: str, monkeypatch) -> None:
    """torchrun scripts call torch.tpu.set_device(local_rank) and DDP(device_ids=[local_rank]): in a run of several
    processes, tpu:<that index> is the process's own device, and the current device is the index its tensors
    report (FSDP2 places parameters on the current device)."""
    from tputool.backend import tpu_module

    with pytest.raises(RuntimeError, match="tpu:1"):  # one process: tpu:1 is another device (or none)
        torch.ones(2).to("tpu:1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(tpu_module, "_selected", None)
    torch.tpu.set_device(1)
    x = torch.arange(3.0).to("tpu:1") + torch.empty(3, device=torch.device("tpu", 1)).fill_(1)
    torch.testing.assert_close(x.cpu(), torch.arange(3.0) + 1)
    assert torch.device("tpu", torch.tpu.current_device()) == x.device
    with pytest.raises(RuntimeError, match="2 process"):
        torch.tpu.set_device(2)


def test_copies_on_a_side_stream_as_ddp_makes_them(tpu_device: str) -> None:
    """DDP(device_ids=[i]) copies inputs on a side stream and marks them with record_stream (one in-order
    stream on tpu: nothing to do, and no CPU fallback)."""
    from torch.nn.parallel._functions import _get_stream

    from tputool.backend import events

    fallbacks = events.total("fallback")
    stream = _get_stream(torch.device(tpu_device, 0))
    with stream:
        out = torch.arange(3.0).to(tpu_device)
    torch.accelerator.current_stream().wait_stream(stream)
    out.record_stream(torch.accelerator.current_stream())
    torch.tpu.current_stream().wait_stream(torch.tpu.Stream())
    torch.testing.assert_close(out.cpu(), torch.arange(3.0))
    assert events.total("fallback") == fallbacks
