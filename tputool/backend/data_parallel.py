"""`torch.nn.DataParallel` on tpu: over one device it runs, as on one CUDA GPU; over several it fails clearly.

Where no CUDA device is present and tpu is, DataParallel (and `nn.parallel.data_parallel`) picks the tpu devices.
It moves inputs with `nn.parallel.comm.scatter` and gradients back with `comm.gather`, which call CUDA-only
kernels (`torch._C._scatter`, absent from a CPU build of PyTorch): a script that wraps its model for one GPU
(pytorch/examples imagenet: `nn.DataParallel(model).cuda()`) failed on tpu with "module 'torch._C' has no
attribute '_scatter'". `install()` wraps both functions: to one tpu device they are a copy to it (what CUDA's
kernels compute for one device; DataParallel then calls the module itself), to several they raise an error that
names DistributedDataParallel, since replicating a module over devices inside one process is not supported on
tpu (`tputool check`: TPU410). Every other call goes to PyTorch's functions unchanged.
"""

from __future__ import annotations

from typing import Any

import torch

_installed = False

SEVERAL = ("nn.DataParallel over {n} tpu devices: replicating a module across devices in one process is not "
           "supported on tpu; use DistributedDataParallel with one process per device (`tputool run --nproc {n}`), "
           "or DataParallel(module, device_ids=[0]) for one device (TPU410)")
"""The error for DataParallel over several tpu devices."""


def _on_tpu() -> bool:
    """Whether DataParallel targets tpu devices here (PyTorch's own choice: `_get_available_device_type`)."""
    return torch._utils._get_available_device_type() == "tpu"


def _device(index: Any) -> torch.device:
    if isinstance(index, torch.device):
        return index
    return torch.device("tpu", index)


def install() -> None:
    """Wrap `torch.nn.parallel.comm.scatter` and `gather` once (idempotent)."""
    global _installed
    if _installed:
        return
    from torch.nn.parallel import comm

    scatter, gather = comm.scatter, comm.gather

    def tpu_scatter(tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
        if out is not None or devices is None or not _on_tpu():
            return scatter(tensor, devices, chunk_sizes, dim, streams, out=out)
        if len(devices) != 1:
            raise NotImplementedError(SEVERAL.format(n=len(devices)))
        return (tensor.to(_device(devices[0])),)

    def tpu_gather(tensors, dim=0, destination=None, *, out=None):
        if out is not None or len(tensors) != 1 or not _on_tpu():
            if out is None and len(tensors) > 1 and _on_tpu():
                raise NotImplementedError(SEVERAL.format(n=len(tensors)))
            return gather(tensors, dim, destination, out=out)
        where = torch.device("cpu") if destination in (-1, "cpu") else _device(
            tensors[0].device.index if destination is None else destination)
        return tensors[0].to(where)

    tpu_scatter.__wrapped__, tpu_gather.__wrapped__ = scatter, gather
    comm.scatter, comm.gather = tpu_scatter, tpu_gather
    _installed = True
