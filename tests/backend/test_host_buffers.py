"""A host tensor written right after an op read it: the op keeps the value the tensor had when it was called, as on
CUDA. JAX reads a host array when its transfer reaches the front of the device's queue, so while earlier work
still runs the tensor's later writes leaked in (nanochat's AdamW refills one 0-d CPU learning-rate tensor per
parameter group: every group after the first updated with the next group's rate, and training diverged)."""

from __future__ import annotations

import pytest
import torch


def _busy(device: str, n: int = 384, steps: int = 12):
    """A compiled chain of matmuls: once warm, a call is queued on the device and returns before it has run."""

    @torch.compile(backend="tpu", fullgraph=True, dynamic=False)
    def chain(a):
        for _ in range(steps):
            a = (a @ a).tanh()
        return a

    a = torch.randn(n, n, device=device)
    chain(a).cpu()  # (compiled and run once: later calls only queue)
    return lambda: chain(a)


def test_a_compiled_call_keeps_the_value_of_a_cpu_scalar_refilled_after_it(tpu_device: str) -> None:
    @torch.compile(backend="tpu", fullgraph=True, dynamic=False)
    def scale_(p, lr):
        p.mul_(lr)

    busy = _busy(tpu_device)
    lr = torch.tensor(2.0)
    scale_(torch.ones(4, device=tpu_device), lr)  # (compiled)
    got = []
    for value in (3.0, 5.0):
        p = torch.ones(4, device=tpu_device)
        lr.fill_(value)
        busy()
        scale_(p, lr)
        lr.fill_(100.0)  # the next parameter group's rate
        got.append(p)
    assert [p.cpu().tolist() for p in got] == [[3.0] * 4, [5.0] * 4]


@pytest.mark.parametrize("how", ["to", "copy_", "mul"])
def test_a_host_buffer_refilled_after_its_transfer_leaves_the_device_copy_alone(how: str, tpu_device: str) -> None:
    busy = _busy(tpu_device)
    staging = torch.empty(8)
    dev = torch.zeros(8, device=tpu_device)
    got = []
    for batch in range(3):
        staging.fill_(float(batch + 1))
        busy()
        if how == "to":
            out = staging.to(tpu_device, non_blocking=True)
        elif how == "copy_":
            out = dev.clone()
            out.copy_(staging, non_blocking=True)
        else:  # a 0-d host tensor meeting a tpu tensor in an eager op
            out = torch.ones(8, device=tpu_device) * staging[0]
        staging.fill_(-1.0)  # the next batch is written into the same buffer
        got.append(out)
    assert [t.cpu().tolist() for t in got] == [[1.0] * 8, [2.0] * 8, [3.0] * 8]
