"""The process keeps a bounded number of XLA executables (`tputool.backend.executables`): XLA:CPU maps each one
it loads into the process, and past `vm.max_map_count` maps (~12,000 executables) the next one segfaults inside
XLA. Our own test session died so, at 40%."""

from __future__ import annotations

import pytest
import torch

from tputool.backend import executables, runtime


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


@pytest.fixture
def small_budget(monkeypatch: pytest.MonkeyPatch) -> int:
    """A budget of 40 executables, counted from zero."""
    monkeypatch.setattr(executables, "_budget", 40)
    monkeypatch.setattr(executables, "_live", 0)
    return 40


@pytest.mark.parametrize("mode", [runtime.EagerMode.DEFER_NEVER, runtime.EagerMode.DEFER_AND_FUSE])
def test_many_shapes_keep_the_memory_maps_bounded_and_the_results_right(small_budget, mode):
    runtime.set_mode(mode)
    try:
        purges = executables.purges
        before = _maps()
        for n in range(1, 121):  # 120 new shapes, several programs each
            a = torch.arange(n, dtype=torch.float32)
            got = ((a.to("tpu") * 3 + 1).sum()).item()
            assert got == float((a * 3 + 1).sum())
        grown = _maps() - before
    finally:
        runtime.set_mode(runtime.DEFAULT_MODE)
    # ~5 maps per live executable on XLA:CPU: kept, the programs of 120 shapes add over 1,000 maps
    assert grown < 400, grown
    assert executables.purges - purges >= 3
    assert executables.live() <= small_budget + 8


def test_fused_kept_executables_are_dropped_and_loaded_again(small_budget, tmp_path, monkeypatch):
    from tputool.backend import fused, fused_disk

    monkeypatch.setenv("TPUTOOL_CACHE_DIR", str(tmp_path))
    fused_disk.reset()
    runtime.set_mode(runtime.EagerMode.DEFER_AND_FUSE)
    try:
        x = torch.randn(5, 7)

        def step() -> torch.Tensor:
            t = x.to("tpu")
            return (t.sin() * 2 + t.cos()).sum(0).cpu()

        want = (x.sin() * 2 + x.cos()).sum(0)
        torch.testing.assert_close(step(), want)
        kept = [k for k in list(fused._kept) if k.exe is not None and k.exe is not fused._JIT_ONLY]
        assert kept, "the step's computation is kept on disk"
        executables.purge()
        assert all(k.exe is None for k in kept)
        torch.testing.assert_close(step(), want)
    finally:
        runtime.set_mode(runtime.DEFAULT_MODE)
        fused_disk.reset()


def test_a_platform_without_the_limit_never_purges(monkeypatch):
    monkeypatch.setattr(executables, "_budget", 0)
    monkeypatch.setattr(executables, "_live", 10**6)
    purges = executables.purges
    executables.settle()
    assert executables.purges == purges
