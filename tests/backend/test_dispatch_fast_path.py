"""Eager dispatch's fast path (a plan per positional-argument types, `LoweredOp.direct_kernel`): the
results, errors and events it gives must be the general path's, whatever arguments follow a learned plan."""

from __future__ import annotations

import pytest
import torch

from tputool.backend import events, runtime


@pytest.fixture
def dev(tpu_device):
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_NEVER):  # (Strict's dispatcher, whatever the default)
        yield tpu_device


def _pair(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(*shape, generator=g).to(dtype) if dtype.is_floating_point else \
        torch.randint(-5, 5, shape, generator=g, dtype=dtype)
    return c, c.to("tpu")


def test_repeated_calls_follow_static_arguments(dev):
    c, t = _pair(4, 5)
    for dim in (0, 1, 0, -1, 1):
        torch.testing.assert_close(torch.softmax(t, dim).cpu(), torch.softmax(c, dim))
    for dim in (0, 1, 0):
        torch.testing.assert_close(torch.sum(t, dim).cpu(), torch.sum(c, dim))


def test_views_after_a_learned_plan(dev):
    ca, ta = _pair(6, 6, seed=1)
    cb, tb = _pair(6, 6, seed=2)
    for _ in range(3):
        torch.testing.assert_close(torch.add(ta, tb).cpu(), ca + cb)
    # same shape as the storage but transposed, a slice, a reshape: not the storage's base array
    torch.testing.assert_close(torch.add(ta, tb.t()).cpu(), ca + cb.t())
    torch.testing.assert_close(torch.add(ta[1:3], tb[2:4]).cpu(), ca[1:3] + cb[2:4])
    torch.testing.assert_close(torch.relu(ta.view(36)).cpu(), torch.relu(ca.view(36)))
    torch.testing.assert_close(torch.relu(ta[:, 1]).cpu(), torch.relu(ca[:, 1]))


def test_argument_types_dtypes_and_scalars(dev):
    ca, ta = _pair(3, 4, seed=3)
    torch.testing.assert_close(torch.mul(ta, ta).cpu(), ca * ca)
    p = torch.nn.Parameter(ta.clone())
    torch.testing.assert_close(torch.mul(p, ta).detach().cpu(), ca * ca)
    torch.testing.assert_close(torch.mul(ta, torch.tensor(2.5)).cpu(), ca * 2.5)  # 0-dim CPU tensor
    for s in (2.5, -1.0, 3):
        torch.testing.assert_close(torch.mul(ta, s).cpu(), ca * s)
    ci, ti = _pair(3, 4, dtype=torch.int64, seed=4)
    out = torch.mul(ti, ti)
    assert out.dtype == torch.int64
    torch.testing.assert_close(out.cpu(), ci * ci)
    mixed = torch.mul(ti, ta)
    assert mixed.dtype == torch.float32
    torch.testing.assert_close(mixed.cpu(), ci * ca)


def test_new_shape_compiles_and_is_counted(dev):
    _, t = _pair(2, 3)
    torch.add(t, t)
    before = events.counts[("compile", "aten.add.Tensor")]
    _, u = _pair(7, 11, seed=5)
    torch.testing.assert_close(torch.add(u, u).cpu(), u.cpu() * 2)
    assert events.counts[("compile", "aten.add.Tensor")] == before + 1
    torch.add(u, u)
    assert events.counts[("compile", "aten.add.Tensor")] == before + 1


def test_errors_through_the_fast_path(dev):
    _, a = _pair(3, 4)
    _, b = _pair(5, 6)
    torch.add(a, a)
    with pytest.raises(RuntimeError):
        torch.add(a, b)
    torch.testing.assert_close(torch.add(a, a).cpu(), a.cpu() * 2)  # still fine afterwards


def test_debug_mode_blocks_and_matches(dev):
    c, t = _pair(4, 4, seed=6)
    old = runtime.STATE.mode
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING)
    try:
        torch.testing.assert_close(torch.add(t, t).cpu(), c + c)
    finally:
        torch.tpu.set_eager_mode(old)


def test_uninitialized_and_inplace_inputs(dev):
    e = torch.empty(3, 3, device="tpu")
    assert torch.mul(e, 0.0).shape == (3, 3)
    c, t = _pair(3, 3, seed=7)
    torch.add(t, t)
    t.add_(1)  # the storage's array is replaced; a later fast call must read the new one
    c.add_(1)
    torch.testing.assert_close(torch.add(t, t).cpu(), c + c)
    x = t.clone()
    x.resize_(9)
    torch.testing.assert_close(torch.relu(x).cpu(), torch.relu(c.reshape(9)))
