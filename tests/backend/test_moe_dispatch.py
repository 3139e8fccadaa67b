"""The MoE layer's dispatch choices (dense, sparse through ragged / gmm grouped matmuls) agree, values and
gradients, on CPU, on the tpu device in eager mode and under torch.compile; the runtime choice reaches it."""

from __future__ import annotations

import pytest
import torch

import tputool.backend  # noqa: F401 - registers the device
from tputool.backend import runtime
from tputool.models.moe import DISPATCHES, MoEConfig, MoEFeedForward, build, example_batch
from tputool.models.spec import classification_loss


def _layer(dispatch: str | None = None) -> MoEFeedForward:
    torch.manual_seed(0)
    return MoEFeedForward(dim=16, ffn_dim=32, n_experts=4, top_k=2, dispatch=dispatch)


def _x() -> torch.Tensor:
    return torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(1))


def _step(layer: MoEFeedForward, x: torch.Tensor, device: str, fn=None):
    layer = layer.to(device)
    x = x.detach().to(device).requires_grad_()
    out = (fn or layer)(x)
    (out * out).sum().backward()
    grads = [x.grad] + [p.grad for p in layer.parameters()]
    return [out.detach().cpu()] + [g.cpu() for g in grads]


def _close(got, want, tol: float = 1e-4) -> None:
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=tol, atol=tol)


@pytest.fixture(autouse=True)
def _fresh_dispatch():
    yield
    runtime.STATE.moe_dispatch = None


def test_sparse_dispatch_matches_dense_on_cpu():
    want = _step(_layer("dense"), _x(), "cpu")
    for d in DISPATCHES[1:]:
        _close(_step(_layer(d), _x(), "cpu"), want)


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_each_dispatch_matches_cpu_dense_on_tpu(tpu_device, dispatch):
    _close(_step(_layer(dispatch), _x(), "tpu"), _step(_layer("dense"), _x(), "cpu"))


@pytest.mark.parametrize("dispatch", DISPATCHES)
def test_model_loss_and_grads_under_torch_compile(tpu_device, dispatch):
    cfg = MoEConfig(n_layers=1, max_seq_len=16, dispatch=dispatch)
    x, y = example_batch(cfg, 2)

    def run(device: str, compiled: bool):
        torch.manual_seed(0)
        model = build(cfg if device == "tpu" else MoEConfig(n_layers=1, max_seq_len=16, dispatch="dense"))
        model = model.to(device)
        f = torch.compile(model, backend="tpu") if compiled else model
        loss = classification_loss(f(x.to(device)), y.to(device))
        loss.backward()
        return [loss.detach().cpu()] + [p.grad.cpu() for p in model.parameters()]

    _close(run("tpu", True), run("cpu", False))


def test_runtime_choice_reaches_a_layer_without_its_own(tpu_device, moe_expert_calls):
    calls = moe_expert_calls
    layer, x = _layer(), _x()
    want = _step(_layer("dense"), x, "cpu")
    _close(_step(layer, x, "tpu"), want)
    assert calls == []  # unset: dense
    runtime.STATE.moe_dispatch = "gmm"
    layer.zero_grad()
    _close(_step(layer, x, "tpu"), want)
    assert calls == ["gmm"]  # one op: sort, three grouped matmuls, combine


def test_unknown_dispatch_is_refused():
    with pytest.raises(ValueError, match="dispatch must be one of"):
        MoEFeedForward(8, 8, 2, 1, dispatch="sparse")


def test_moe_experts_refuses_bad_shapes_and_impls():
    layer, x = _layer(), _x()
    top_w, top_i = layer.route(x)
    with pytest.raises(ValueError, match="unknown impl 'dense'"):
        torch.tpu.ops.moe_experts(x, top_w, top_i, layer.w1, layer.w3, layer.w2, impl="dense")
    with pytest.raises(ValueError, match=r"w2 \(experts, ffn, dim\)"):
        torch.tpu.ops.moe_experts(x, top_w, top_i, layer.w1, layer.w3, layer.w1, impl="gmm")
    with pytest.raises(ValueError, match="top_w and top_i"):
        torch.tpu.ops.moe_experts(x, top_w[..., :1], top_i, layer.w1, layer.w3, layer.w2)
