"""`torch.inference_mode()` on tpu behaves as on CPU: views of normal tensors taken inside it are normal tensors
(nanochat's KV-cache decoding slices its rotary buffers under it: "Cannot set version_counter for inference
tensor" on every view), outputs made inside it are inference tensors, and what CPU refuses is refused."""

from __future__ import annotations

import pytest
import torch

VIEWS = {
    "slice": lambda t: t[:, 1:3],
    "select": lambda t: t[0],
    "view": lambda t: t.view(-1),
    "transpose": lambda t: t.t(),
    "expand": lambda t: t[:1].expand(3, 4),
    "unsqueeze": lambda t: t.unsqueeze(0),
    "as_strided": lambda t: t.as_strided((2, 2), (1, 4)),
    "dtype view": lambda t: t.view(torch.int32),
    "unbind": lambda t: t.unbind(0)[1],
}


def _outcome(device: str, make_inside: bool, op) -> tuple:
    """(values, is_inference of the result, is_inference of a view of it taken outside) or the error's type."""
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    if not make_inside:
        base = base.to(device)
    try:
        with torch.inference_mode():
            t = base.to(device, copy=True) if make_inside else base
            out = op(t)
            out2 = out * 2  # an op's output made inside: an inference tensor
        later = out[..., :1]
        return out.cpu().tolist(), out.is_inference(), out2.is_inference(), later.is_inference()
    except RuntimeError as e:
        return (type(e).__name__,)


@pytest.mark.parametrize("make_inside", [False, True], ids=["normal base", "inference base"])
@pytest.mark.parametrize("name", list(VIEWS))
def test_views_under_inference_mode_are_the_kind_cpu_makes(name: str, make_inside: bool, mode: str,
                                                            tpu_device: str) -> None:
    op = VIEWS[name]
    assert _outcome(tpu_device, make_inside, op) == _outcome("cpu", make_inside, op)


def test_in_place_writes_and_the_refusals_match_cpu(mode: str, tpu_device: str) -> None:
    def run(device: str) -> list:
        seen = []
        w = torch.ones(4, device=device, requires_grad=True)
        buf = torch.zeros(4, device=device)
        with torch.inference_mode():
            buf[1:3] += 5  # a normal tensor written in place inside: allowed, its version moves
            inf = torch.ones(4, device=device)
            pos = inf[0].item()
        seen.append((buf.cpu().tolist(), buf._version > 0, pos))
        for bad in (lambda: inf.add_(1), lambda: (w * inf).sum().backward()):
            try:
                bad()
                seen.append("ran")
            except RuntimeError as e:
                seen.append(str(e).split(".")[0])
        return seen

    assert run(tpu_device) == run("cpu")
