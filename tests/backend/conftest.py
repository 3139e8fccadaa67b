"""Fixtures for the backend validation tests, and the OpInfo sweep's session summary and JSON report."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from tests.backend import _opinfo

_START = time.time()


def _enable_persistent_jax_cache() -> None:
    """Keep XLA executables across test runs (build/jax-cache; TPUTOOL_TEST_JAX_CACHE=path, or 0 for off).

    Every eager op compiles once per shape, so a cold run of these tests spends most of its time in XLA.
    """
    where = os.environ.get("TPUTOOL_TEST_JAX_CACHE", "build/jax-cache")
    if where == "0":
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", str(Path(where).resolve()))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


_enable_persistent_jax_cache()


def _default_mode_from_env() -> None:
    """$TPUTOOL_TEST_DEFAULT_EAGER_MODE (a torch.tpu.EagerMode member name): run these tests as if it were the
    backend's default (`runtime.DEFAULT_MODE`, which `runtime.reset` and every test start from)."""
    name = os.environ.get("TPUTOOL_TEST_DEFAULT_EAGER_MODE")
    if name:
        from tputool.backend import runtime

        runtime.DEFAULT_MODE = getattr(runtime.EagerMode, name)


_default_mode_from_env()


@pytest.fixture(autouse=True)
def _default_eager_mode() -> None:
    """Each test starts in the default eager mode (tests that set one restore Strict, whatever the default)."""
    from tputool.backend import runtime

    if runtime.STATE.mode is not runtime.DEFAULT_MODE:
        runtime.set_mode(runtime.DEFAULT_MODE)


@pytest.fixture(params=["cpu", "tpu"])
def dev(request) -> str:
    """Each test twice: on CPU tensors (graph-mode tests then run backend 'tpu' through JAX on the host)
    and on the tpu device (skipped when it cannot be created)."""
    return request.getfixturevalue("tpu_device") if request.param == "tpu" else "cpu"


@pytest.fixture
def tpu_device() -> str:
    """The device under test: `tpu`, or $TPUTOOL_TEST_DEVICE (`cpu` checks the tests themselves), in the
    eager mode $TPUTOOL_TEST_EAGER_MODE (a torch.tpu.EagerMode member name) if set.

    Skips when no tensor can be made there; tests/backend/test_opinfo.py::test_device_available fails then.
    """
    name = os.environ.get("TPUTOOL_TEST_DEVICE", "tpu")
    try:
        torch.ones(1, device=name).cpu()  # (read back: in Fused mode nothing of the probe is left pending)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no {name} device (see test_opinfo.py::test_device_available): {_opinfo.first_line(e)}")
    mode = os.environ.get("TPUTOOL_TEST_EAGER_MODE")  # e.g. DEFER_AND_FUSE: run these tests in that mode
    if mode and name == "tpu":
        torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode))
    return name


def _write_report(finished: bool) -> Path:
    path = Path(os.environ.get("TPUTOOL_OPINFO_REPORT", "build/opinfo.json"))
    meta = {
        "device": os.environ.get("TPUTOOL_OPINFO_DEVICE", "tpu"),
        "eager_mode": os.environ.get("TPUTOOL_OPINFO_EAGER_MODE", "default"),
        "max_samples_per_op": os.environ.get("TPUTOOL_OPINFO_MAX_SAMPLES", "default (8 slice, 3 others)"),
        "wall_seconds": round(time.time() - _START, 1),
        "finished": finished,
    }
    _opinfo.write_report(_opinfo.RESULTS, path, meta)
    return path


def pytest_runtest_teardown(item, nextitem) -> None:  # noqa: ANN001 - pytest hook
    """Rewrite the JSON report every 20 ops, so a sweep cut short still leaves its results."""
    if _opinfo.RESULTS and len(_opinfo.RESULTS) % 20 == 0 and item.originalname == "test_opinfo":
        _write_report(finished=False)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ANN001 - pytest hook
    """Print `OpInfo sweep: P passed, F failed, S skipped` with failures by cause, and write the JSON report."""
    if not _opinfo.RESULTS:
        return
    terminalreporter.section("OpInfo sweep")
    for line in _opinfo.summary_lines(_opinfo.RESULTS):
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"report: {_write_report(finished=True)}")


EAGER_MODES = ("DEFER_NEVER", "DEFER_AND_FUSE", "DEFER_NEVER_AND_LAUNCH_BLOCKING")


@pytest.fixture(params=EAGER_MODES)
def mode(request, tpu_device: str):
    """Each of the three eager modes in turn (Strict afterwards, as the suite runs)."""
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, request.param))
    yield request.param
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
