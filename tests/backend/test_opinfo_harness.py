"""The OpInfo sweep's comparison machinery catches differences (run on CPU against itself)."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.opinfo.core import SampleInput

from tests.backend import _opinfo


class FakeOp:
    """Just enough of an OpInfo: the second call of `fn` plays the device run."""

    def __init__(self, name: str, fn, samples, autograd: bool = True) -> None:
        self.name, self.variant_test_name, self.decorators = name, "", []
        self.supports_autograd = autograd
        self._fn, self._samples, self.calls = fn, samples, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self._fn(self.calls, *args, **kwargs)

    def sample_inputs(self, device, dtype, requires_grad=False):
        return [SampleInput(t.clone().requires_grad_(requires_grad)) for t in self._samples]


def _run(op: FakeOp) -> _opinfo.OpResult:
    res = _opinfo.run_op(op, torch.float32, "cpu", None, 30.0)
    _opinfo.RESULTS.remove(res)
    return res


def test_identical_runs_pass_with_backward() -> None:
    res = _run(FakeOp("fake_exp", lambda _n, x: x.exp(), [torch.randn(4, 4)]))
    assert res.status == _opinfo.PASSED and res.backward_checked == 1


def test_forward_difference_fails() -> None:
    res = _run(FakeOp("fake_add", lambda n, x: x + (n - 1) * 1e-2, [torch.randn(4, 4)]))
    assert res.status == _opinfo.FAILED and res.cause.startswith("forward mismatch")


def test_backward_difference_fails() -> None:
    def fn(n, x):
        return x * 2 if n == 1 else (x * 3).detach() + x * 2 - (x * 3).detach() + (x * x - (x * x).detach())
    res = _run(FakeOp("fake_grad", fn, [torch.randn(4, 4)]))
    assert res.status == _opinfo.FAILED and res.cause.startswith("backward mismatch")


def test_device_error_fails_and_cpu_error_skips() -> None:
    def device_raises(n, x):
        if n == 2:
            raise NotImplementedError("no lowering for aten::fake\nmore")
        return x
    res = _run(FakeOp("fake_err", device_raises, [torch.randn(2)]))
    assert res.status == _opinfo.FAILED
    assert res.cause == "forward error: NotImplementedError: no lowering for aten::fake"

    def always_raises(n, x):
        raise ValueError("bad sample")
    res = _run(FakeOp("fake_bad", always_raises, [torch.randn(2)], autograd=False))
    assert res.status == _opinfo.SKIPPED and "errors on CPU as well" in res.cause


def test_distribution_check() -> None:
    def same(n, x):
        return torch.randn(1000) + (100.0 if n == 0 else 0.0)
    def wider(n, x):
        return torch.randn(1000) * (1.0 if n == 1 else 3.0)
    def shifted(n, x):
        return torch.randn(1000) + (0.0 if n == 1 else 1.0)
    assert _opinfo._check_distribution(same(2, None), same(1, None), "normal") is None
    for fn in (wider, shifted):
        with pytest.raises(_opinfo.SampleFailure, match="distribution mismatch"):
            _opinfo._check_distribution(fn(2, None), fn(1, None), "normal")
    with pytest.raises(_opinfo.SampleFailure, match="negative values"):
        _opinfo._check_distribution(torch.randn(10), torch.rand(10), "exponential")
    with pytest.raises(_opinfo.SampleFailure, match="non-integer"):
        _opinfo._check_distribution(torch.rand(10), torch.ones(10), "bernoulli")


def test_summary_groups_failures_by_cause() -> None:
    rs = [_opinfo.OpResult("a", "float32"), _opinfo.OpResult("b", "float32", status=_opinfo.FAILED, cause="X"),
          _opinfo.OpResult("c", "float32", status=_opinfo.FAILED, cause="X"),
          _opinfo.OpResult("d", "int64", status=_opinfo.PASSED_FALLBACK)]
    lines = _opinfo.summary_lines(rs)
    assert lines[0].startswith("OpInfo sweep: 1 passed, 1 passed (fallback), 2 failed, 0 skipped")
    assert any("   2  X" in line for line in lines)
