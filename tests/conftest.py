"""Fixtures shared by the test packages."""

from __future__ import annotations

import sys

import pytest

_built_seen = [0]


@pytest.fixture(autouse=True)
def _bounded_executables():
    """After each test that built executables, drop them all once the process's memory maps pass half the
    backend's limit (`executables.check`; past vm.max_map_count XLA:CPU cannot map the next executable and the
    session dies with a segmentation fault). The backend drops them itself past its whole limit, after a
    compile: at half, here, that never lands inside a test that counts its compiles; and tests that call JAX
    directly compile too, which only this sees."""
    yield
    executables = sys.modules.get("tputool.backend.executables")
    if executables is not None and executables.built() != _built_seen[0]:
        _built_seen[0] = executables.built()
        executables.check(share=0.5)


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
