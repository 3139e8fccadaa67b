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
