"""The op plan (`tputool.backend.op_plan`) decides how an op runs; every executor follows it.

Pins the eager handlers (and the inlined fast-path kernels registered with torch.library) to the plan's
route, the traced table to the plan's traced lowering, and in-place casting rules to one place: Strict and
Fused give the same results and the same errors.
"""

from __future__ import annotations

import pytest
import torch

from tputool.backend import dispatch, fallback, op_plan
from tputool.backend.lowerings import LOWERINGS
from tputool.backend.op_plan import Route

aten = torch.ops.aten

HANDLER_OF_ROUTE = {
    Route.LOWERED: dispatch.LoweredOp,
    Route.INPLACE: dispatch.InplaceOp,
    Route.OUT: dispatch.OutOp,
    Route.DECOMPOSED: dispatch.DecompOp,
    Route.DECOMPOSED_THEN_WRITE: dispatch.DecompOp,
    Route.CPU: fallback.CpuOp,
}

SAMPLE_OPS = [
    (aten.add.Tensor, Route.LOWERED),
    (aten.add_.Tensor, Route.INPLACE),
    (aten.add.out, Route.OUT),
    (aten.mul_.Scalar, Route.INPLACE),
    (aten.view.default, Route.KERNEL),
    (aten.copy_.default, Route.KERNEL),
    (aten.max_pool2d_with_indices.default, Route.LOWERED),
    (aten.nonzero.default, Route.KERNEL),
]


@pytest.mark.parametrize("op,route", SAMPLE_OPS, ids=lambda x: str(x))
def test_sample_routes(tpu_device, op, route):
    assert op_plan.plan(op).route is route


def test_every_lowered_op_gets_the_handler_its_plan_names(tpu_device):
    ops = list(op_plan.eager_lowered_ops())
    ops += [v for op in ops if (v := _inplace_variant(op)) is not None]
    checked = 0
    for op in ops:
        p = op_plan.plan(op)
        h = dispatch.HANDLERS.get(op) or dispatch.choose(op)
        if type(h) is dispatch._LikeFactory:  # (a `*_like` factory: its tpu handler behind the device= check)
            h = h.h
        if p.route is Route.KERNEL:
            assert h is op_plan.KERNELS[op], op
        else:
            assert type(h) is HANDLER_OF_ROUTE[p.route], (op, p.route, type(h))
            if p.route in (Route.LOWERED, Route.INPLACE, Route.OUT):
                assert h.low == p.lowering, op  # (equal: a test may re-register the same lowering)
        checked += 1
    assert checked > 300


def _inplace_variant(op):
    pkt = getattr(aten, op.overloadpacket.__name__ + "_", None)
    return getattr(pkt, op._overloadname, None) if pkt is not None else None


def test_traced_table_follows_the_plan(tpu_device):
    table = op_plan.TRACED
    # a view op: traced-only (a value in a trace, a storage kernel in eager)
    assert aten.view.default in table and op_plan.eager_lowering(aten.view.default) is None
    assert LOWERINGS[aten.view.default].traced_only
    # foreach ops are synthesized from the per-element lowering, for traced executors only
    assert aten._foreach_add.List in table
    assert op_plan.plan(aten._foreach_add.List).traced is table[aten._foreach_add.List]
    # in-place ops record their functional twin's lowering; out= variants are never recorded
    assert op_plan.plan(aten.add_.Tensor).traced is LOWERINGS[aten.add.Tensor]
    assert op_plan.plan(aten.add.out).traced is None
    # what graphs decompose never has a lowering
    assert not any(op in table for op in op_plan.graph_decompositions())


def test_one_decomposition_policy(tpu_device):
    from torch._decomp import decomposition_table

    for op in (aten.native_batch_norm.default, aten.addcmul.default, aten.max_pool3d_with_indices.default):
        assert op_plan.decomposition(op) is decomposition_table.get(op)


def _run_both(fn):
    """fn() under Strict and under Fused: (result or exception type + first line) for each."""
    outs = []
    for mode in (torch.tpu.EagerMode.DEFER_NEVER, torch.tpu.EagerMode.DEFER_AND_FUSE):
        torch.tpu.set_eager_mode(mode)
        try:
            outs.append(("ok", fn().cpu()))
        except RuntimeError as e:
            outs.append(("error", str(e).splitlines()[0]))
        finally:
            torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    return outs


def test_inplace_cast_rules_are_the_same_in_strict_and_fused(tpu_device):
    def int_into_float():
        x = torch.zeros(3, dtype=torch.float32, device="tpu")
        x.add_(torch.ones(3, dtype=torch.int64, device="tpu"))
        return x

    def float_into_int():  # PyTorch refuses: result type Float can't be cast to Long
        x = torch.zeros(3, dtype=torch.int64, device="tpu")
        x.add_(torch.ones(3, dtype=torch.float32, device="tpu"))
        return x

    def broadcast_into_smaller():  # PyTorch refuses: output shape doesn't match the broadcast shape
        x = torch.zeros(1, dtype=torch.float32, device="tpu")
        x.add_(torch.ones(3, device="tpu"))
        return x

    strict, fused = _run_both(int_into_float)
    assert strict[0] == fused[0] == "ok"
    torch.testing.assert_close(strict[1], fused[1])
    for fn in (float_into_int, broadcast_into_smaller):
        strict, fused = _run_both(fn)
        assert strict[0] == "error" and fused[0] == "error", (fn.__name__, strict, fused)
