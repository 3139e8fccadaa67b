"""The XLA executables of a process keep its memory maps bounded (`tputool.backend.executables`): XLA:CPU maps
each executable it loads into the process, and past `vm.max_map_count` maps the next one segfaults inside XLA.
Our own test session died so, at 40%."""

from __future__ import annotations

import pytest
import torch

from tputool.backend import executables, runtime

_maps = executables.maps


@pytest.fixture
def small_budget(monkeypatch: pytest.MonkeyPatch) -> int:
    """A limit 300 maps above the process's maps now, counted after every executable."""
    executables.purge()
    limit = _maps() + 300
    monkeypatch.setattr(executables, "_limit", limit)
    monkeypatch.setattr(executables, "MAPS_PER_EXECUTABLE", 10**6)
    monkeypatch.setattr(executables, "_next_check", 0)
    return limit


@pytest.mark.parametrize("mode", [runtime.EagerMode.DEFER_NEVER, runtime.EagerMode.DEFER_AND_FUSE])
def test_many_shapes_keep_the_memory_maps_bounded_and_the_results_right(small_budget, mode):
    runtime.set_mode(mode)
    try:
        purges = executables.purges
        before = _maps()
        for n in range(1, 201):  # 200 new shapes, several programs each
            a = torch.arange(n, dtype=torch.float32)
            got = ((a.to("tpu") * 3 + 1).sum()).item()
            assert got == float((a * 3 + 1).sum())
        grown = _maps() - before
    finally:
        runtime.set_mode(runtime.DEFAULT_MODE)
    # a few maps per small executable on XLA:CPU: kept, the programs of 200 shapes add well over 1,000 maps
    assert grown < 400, grown
    assert executables.purges - purges >= 3
    assert _maps() <= small_budget


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
    monkeypatch.setattr(executables, "_limit", 0)
    monkeypatch.setattr(executables, "_next_check", 0)
    purges = executables.purges
    executables.settle()
    assert executables.purges == purges
    assert executables._next_check == float("inf")


def test_the_maps_are_counted_again_before_the_room_left_could_fill(monkeypatch):
    monkeypatch.setattr(executables, "_limit", executables.maps() + 5000)
    monkeypatch.setattr(executables, "_next_check", 0)
    assert not executables.check()
    # 5,000 maps of room, at most 1,000 per executable: counted again within 5 executables
    assert 1 <= executables._next_check - executables.built() <= 5
