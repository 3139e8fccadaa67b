"""A compiled function whose frame Dynamo gives up on (a graph break inside a loop) runs that frame eagerly: its
tpu ops then run the device's own kernels, which call JAX, as plain Python (Dynamo does not trace into JAX)."""

from __future__ import annotations

import torch
import torch._dynamo

from tputool.backend.graph import install


def _broken_in_a_loop(x: torch.Tensor) -> torch.Tensor:
    for _ in range(2):
        x = x.sin()
        torch._dynamo.graph_break()  # (in a loop: Dynamo skips the whole frame, it runs eagerly)
    return torch.nn.functional.embedding(torch.tensor([2, 0], device=x.device), x)


def test_a_frame_dynamo_skips_runs_its_tpu_ops_eagerly(tpu_device: str) -> None:
    install()
    torch._dynamo.reset()
    x = torch.arange(12.0).view(3, 4)
    got = torch.compile(_broken_in_a_loop, backend="tpu")(x.to(tpu_device)).cpu()
    torch._dynamo.reset()
    torch.testing.assert_close(got, _broken_in_a_loop(x))


def _copy_in(buf: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    torch.ops.fsdp.copy_(buf, x * 2)  # (what traced FSDP2 writes all-gathered parameters with)
    return buf + 1


def test_fsdp_copy_into_a_graph_input_compiles(tpu_device: str) -> None:
    import torch.distributed.fsdp._fully_shard._fsdp_param  # noqa: F401 - defines torch.ops.fsdp.copy_

    install()
    torch._dynamo.reset()
    x = torch.arange(6.0).view(2, 3)
    buf = torch.zeros(2, 3, device=tpu_device)
    got = torch.compile(_copy_in, backend="tpu", fullgraph=True)(buf, x.to(tpu_device)).cpu()
    torch._dynamo.reset()
    want_buf = torch.zeros(2, 3)
    torch.testing.assert_close(got, _copy_in(want_buf, x))
    torch.testing.assert_close(buf.cpu(), want_buf)
