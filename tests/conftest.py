"""Fixtures shared by the test packages."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture(autouse=True)
def _bounded_executables():
    """After each test, drop the process's XLA executables once there are too many (`executables.settle`; the
    backend does it after its own compiles, and tests that call JAX directly compile too): past ~12,000 live ones
    XLA:CPU cannot map the next and the session dies with a segmentation fault."""
    yield
    executables = sys.modules.get("tputool.backend.executables")
    if executables is not None:
        executables.settle()


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
