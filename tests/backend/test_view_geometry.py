"""The Python view geometry (used by Fused mode) equals PyTorch's for random tensors and arguments."""

from __future__ import annotations

import random

import pytest
import torch

from tputool.backend.view_geometry import GEOMETRY

aten = torch.ops.aten


def _random_tensor(rng: random.Random) -> torch.Tensor:
    """A CPU tensor seen through a random view (transposed, sliced, offset, expanded) of a buffer."""
    n = rng.randint(0, 4)
    size = [rng.randint(1, 4) for _ in range(n)]
    x = torch.zeros(size)
    if n >= 2 and rng.random() < 0.5:
        x = x.transpose(0, n - 1)
    if n >= 1 and rng.random() < 0.5 and x.shape[0] > 1:
        x = x[1:]
    if n >= 1 and rng.random() < 0.3:
        x = x.unsqueeze(0).expand(2, *x.shape)
    return x


def _random_args(op, x: torch.Tensor, rng: random.Random) -> tuple:
    n = x.dim()
    d = lambda k=n: rng.randint(-max(k, 1), max(k, 1) - 1)  # noqa: E731
    if op is aten.transpose.int:
        return (d(), d())
    if op is aten.t.default:
        return ()
    if op is aten.permute.default:
        dims = list(range(n))
        rng.shuffle(dims)
        return ([p - n if rng.random() < 0.3 else p for p in dims],)
    if op is aten.unsqueeze.default:
        return (d(n + 1),)
    if op is aten.expand.default:
        lead = [rng.randint(1, 3) for _ in range(rng.randint(0, 2))]
        return (lead + [rng.choice([s, -1, 3]) if s == 1 else rng.choice([s, -1]) for s in x.shape],)
    if op is aten.slice.Tensor:
        if n == 0:
            return ()
        pick = lambda: rng.choice([None, rng.randint(-6, 6), 2**63 - 1])  # noqa: E731
        return (d(), pick(), pick(), rng.randint(1, 3))
    if op is aten.select.int:
        if n == 0:
            return None
        dim = d()
        return (dim, rng.randint(-x.shape[dim], x.shape[dim] - 1))
    if op is aten.view.default:
        numel = x.numel()
        return (rng.choice([[numel], [-1], [1, numel], [numel, 1, -1]]),)
    raise AssertionError(op)


@pytest.mark.parametrize("op", list(GEOMETRY), ids=str)
def test_geometry_matches_pytorch(op) -> None:
    rng = random.Random(str(op))
    checked = 0
    for _ in range(300):
        x = _random_tensor(rng)
        args = _random_args(op, x, rng)
        if args is None:
            continue
        try:
            ref = op(x, *args)
        except (RuntimeError, IndexError):
            ref = None
        got = GEOMETRY[op](x, *args)
        if got is None:
            continue  # left to PyTorch (which also raises where it should)
        assert ref is not None, (op, x.shape, x.stride(), args)
        assert (list(ref.shape), list(ref.stride()), ref.storage_offset()) == (list(got[0]), list(got[1]), got[2]), (
            op, tuple(x.shape), x.stride(), x.storage_offset(), args)
        checked += 1
    assert checked > 100  # most random cases are handled here, not left to PyTorch


def test_fused_views_share_storage_and_read_back(tpu_device: str) -> None:
    from tputool.backend import fused

    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    try:
        x = torch.arange(24.0, device=tpu_device).view(2, 3, 4)
        v = x.transpose(0, 2)[1:].select(1, -1).unsqueeze(0).expand(3, -1, -1)
        assert v.untyped_storage()._cdata == x.untyped_storage()._cdata  # one storage: a true view
        ref = torch.arange(24.0).view(2, 3, 4).transpose(0, 2)[1:].select(1, -1).unsqueeze(0).expand(3, -1, -1)
        assert (v.shape, v.stride(), v.storage_offset()) == (ref.shape, ref.stride(), ref.storage_offset())
        x.add_(1)  # written through the base: the view sees it
        fused.flush("test")
        torch.testing.assert_close(v.cpu(), ref + 1)
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
