"""The backend's runtime state lives in one object (`runtime.STATE`) with one reset point (`runtime.reset`)."""

from __future__ import annotations

import torch

from tputool.backend import events, runtime


def test_reset_returns_to_a_fresh_process_state(tpu_device):
    fresh_rng = runtime.Runtime().rng_seed, runtime.Runtime().rng_counter
    torch.tpu.manual_seed(123)
    torch.rand(3, device="tpu")
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    x = torch.ones(4, device="tpu") * 2  # pending in the Fused trace
    assert runtime.STATE.trace is not None and runtime.STATE.trace.nodes
    events.record("host_sync", "test")
    try:
        runtime.reset()
        assert runtime.STATE.mode is runtime.DEFAULT_MODE and not runtime.STATE.blocking
        assert torch.tpu.eager_mode() is runtime.DEFAULT_MODE
        assert not runtime.STATE.trace.nodes  # dropped, not run
        assert (runtime.STATE.rng_seed, runtime.STATE.rng_counter) == fresh_rng
        assert not events.counts and not runtime.STATE.in_flight
    finally:
        torch.tpu.set_eager_mode(runtime.DEFAULT_MODE)
    del x


def test_debug_mode_sets_blocking_in_the_state(tpu_device):
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_NEVER_AND_LAUNCH_BLOCKING):
        assert runtime.STATE.blocking
    assert not runtime.STATE.blocking


def test_rng_state_round_trips_through_the_state(tpu_device):
    torch.tpu.manual_seed(7)
    a = torch.rand(5, device="tpu").cpu()
    saved = torch.tpu.get_rng_state()
    b = torch.rand(5, device="tpu").cpu()
    torch.tpu.set_rng_state(saved)
    torch.testing.assert_close(torch.rand(5, device="tpu").cpu(), b)
    assert not torch.equal(a, b)
