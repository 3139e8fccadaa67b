"""Fixtures shared by the test packages."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _bounded_executables():
    """Between tests, drop the process's XLA executables once half the budget is used (past ~12,000 live ones
    XLA:CPU cannot map the next and the session dies with a segmentation fault). The backend drops them itself
    past the whole budget, after a compile: at half, here, that never happens inside a test that counts its
    compiles (tests that call JAX directly compile too, and only this sees theirs)."""
    yield
    executables = sys.modules.get("tputool.backend.executables")
    if executables is not None and 0 < executables.budget() // 2 < executables.live():
        executables.purge()


@pytest.fixture
def moe_expert_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The `impl` of each call the built-in MoE layers make to the sparse expert op during the test (a spy that
    still runs the op)."""
    from tputool.models import moe

    calls: list[str] = []
    real = moe.moe_experts

    def counted(*args, impl):
        calls.append(impl)
        return real(*args, impl=impl)

    monkeypatch.setattr(moe, "moe_experts", counted)
    return calls
