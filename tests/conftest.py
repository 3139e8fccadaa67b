"""Fixtures shared by the test packages."""

from __future__ import annotations

import pytest


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
