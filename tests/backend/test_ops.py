"""Ops of the tpu backend that models lean on, forward and backward, against PyTorch on CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tputool.backend  # noqa: F401 - registers the device
from tputool.backend import events

T = "tpu"


def run_both(fn, *inputs, grad: bool = True, atol=1e-5, rtol=1e-4):
    """fn on CPU and on tpu copies of `inputs`; outputs and (if grad) input gradients must match."""
    cpu_in = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) for x in inputs]
    tpu_in = [x.detach().clone().to(T).requires_grad_(grad and x.is_floating_point()) for x in inputs]
    ref, got = fn(*cpu_in), fn(*tpu_in)
    torch.testing.assert_close(got.cpu(), ref, atol=atol, rtol=rtol)
    if grad and ref.requires_grad:
        g = torch.randn_like(ref)
        ref.backward(g)
        got.backward(g.to(T))
        for c, t in zip(cpu_in, tpu_in, strict=True):
            if c.grad is not None:
                torch.testing.assert_close(t.grad.cpu(), c.grad, atol=atol, rtol=rtol)


def test_no_fallback_for_common_model_ops(monkeypatch):
    monkeypatch.setenv("TPUTOOL_FALLBACK", "error")
    x = torch.randn(2, 3, 8, 8)
    run_both(lambda a, w: F.conv2d(a, w, padding=1, stride=2), x, torch.randn(4, 3, 3, 3))
    run_both(lambda a, w: F.conv_transpose2d(a, w, stride=2), x, torch.randn(3, 2, 3, 3))
    run_both(lambda a: F.max_pool2d(a, 2), x)
    run_both(lambda a: F.avg_pool2d(a, 3, stride=2, padding=1), x)
    run_both(lambda a: F.adaptive_avg_pool2d(a, 1), x)
    run_both(lambda a, w, b: F.layer_norm(a, (8,), w, b), x, torch.randn(8), torch.randn(8))
    run_both(lambda a: F.gelu(a, approximate="tanh").tanh().sigmoid(), x)
    run_both(lambda a: F.silu(a) * F.softmax(a, -1) + F.log_softmax(a, 1), x)
    q = torch.randn(2, 4, 6, 8)
    run_both(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, q + 1, q - 1)
    w = torch.randn(10, 4)
    idx = torch.tensor([[1, 2, 3], [9, 0, 1]])
    run_both(lambda e, i: F.embedding(i, e), w, idx)
    run_both(lambda a, t: F.cross_entropy(a, t), torch.randn(5, 7), torch.randint(0, 7, (5,)))
    run_both(lambda a, b: F.mse_loss(a, b), torch.randn(5, 7), torch.randn(5, 7))


def test_batch_norm_training_updates_running_stats():
    bn_c = torch.nn.BatchNorm2d(3)
    bn_t = torch.nn.BatchNorm2d(3).to(T)
    x = torch.randn(4, 3, 5, 5)
    torch.testing.assert_close(bn_t(x.to(T)).cpu(), bn_c(x), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(bn_t.running_mean.cpu(), bn_c.running_mean)
    torch.testing.assert_close(bn_t.running_var.cpu(), bn_c.running_var)
    assert bn_t.num_batches_tracked.item() == 1


def test_indexing_ops():
    x = torch.randn(5, 6)
    i = torch.tensor([0, 3, 3])
    run_both(lambda a: a[i], x)
    run_both(lambda a: a[:, i] * 2, x)
    run_both(lambda a: a.gather(1, torch.tensor([[0, 1], [2, 3], [4, 5], [0, 0], [1, 1]]).to(a.device)), x)
    run_both(lambda a: a.index_select(0, i.to(a.device)), x)
    run_both(lambda a: torch.zeros(5, 6, device=a.device).scatter_add(0, torch.ones(5, 6, dtype=torch.long,
                                                                                     device=a.device), a), x)
    c = x.clone()
    t = x.to(T)
    c[c > 0] = 0.0
    t[t > 0] = 0.0
    torch.testing.assert_close(t.cpu(), c)
    c[torch.tensor([1, 2])] += 1
    t[torch.tensor([1, 2]).to(T)] += 1
    torch.testing.assert_close(t.cpu(), c)


def test_data_dependent_shapes_sync_the_host_once_each_and_never_fall_back():
    events.reset()
    x = torch.randn(3, 10)
    t = x.to(T)
    torch.testing.assert_close(t[t > 0].cpu(), x[x > 0])
    torch.testing.assert_close(torch.masked_select(t, t > 1).cpu(), torch.masked_select(x, x > 1))
    assert torch.equal(torch.nonzero(t > 0).cpu(), torch.nonzero(x > 0))
    assert events.total("fallback") == 0
    assert events.counts[("host_sync", "nonzero")] == 3


def test_reductions_and_shapes():
    x = torch.randn(4, 5, 6)
    for fn in (lambda a: a.sum((0, 2)), lambda a: a.mean(-1, keepdim=True), lambda a: a.var(1),
               lambda a: a.std(), lambda a: a.amax(1), lambda a: a.logsumexp(2), lambda a: a.norm(dim=1),
               lambda a: a.cumsum(1), lambda a: torch.cat([a, a * 2], 1), lambda a: torch.stack([a, a], 0),
               lambda a: a.flip(0).roll(2, 1), lambda a: a.tril(), lambda a: F.pad(a, (1, 2, 0, 1)),
               lambda a: a.max(1).values, lambda a: a.sort(-1).values, lambda a: a.topk(3).values,
               lambda a: a.permute(2, 0, 1).contiguous().view(6, -1), lambda a: a.repeat(1, 2, 1),
               lambda a: a.expand(2, 4, 5, 6).sum(0), lambda a: torch.where(a > 0, a, a * 0.1)):
        run_both(fn, x)


def test_integer_and_bool_ops():
    a = torch.randint(-5, 5, (10,))
    b = torch.randint(1, 5, (10,))
    for fn in (lambda x, y: x // y, lambda x, y: x % y, lambda x, y: x * y, lambda x, y: x & y,
               lambda x, y: torch.div(x, y, rounding_mode="trunc"), lambda x, y: (x > y) | (x == 0),
               lambda x, y: x.argmax() + y.argmin(), lambda x, y: x.sum() + y.prod(), lambda x, y: x.abs().cumsum(0)):
        ref = fn(a, b)
        got = fn(a.to(T), b.to(T))
        assert got.dtype == ref.dtype
        assert torch.equal(got.cpu(), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_backward_dtypes(dtype):
    lin_c = torch.nn.Linear(6, 3).to(dtype)
    lin_t = torch.nn.Linear(6, 3).to(dtype).to(T)
    lin_t.load_state_dict(lin_c.state_dict())
    x = torch.randn(4, 6, dtype=dtype)
    lin_c(x).float().sum().backward()
    lin_t(x.to(T)).float().sum().backward()
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(lin_t.weight.grad.cpu(), lin_c.weight.grad, **tol)
    assert lin_t.weight.grad.dtype == dtype


def test_optimizer_steps_in_place_on_parameters():
    p_c = torch.nn.Parameter(torch.randn(5))
    p_t = torch.nn.Parameter(p_c.detach().clone().to(T))
    for opt_cls in (torch.optim.SGD, torch.optim.Adam):
        oc, ot = opt_cls([p_c], lr=0.1), opt_cls([p_t], lr=0.1)
        for _ in range(3):
            (p_c ** 2).sum().backward()
            (p_t ** 2).sum().backward()
            oc.step()
            ot.step()
            oc.zero_grad()
            ot.zero_grad()
        torch.testing.assert_close(p_t.detach().cpu(), p_c.detach(), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kw", [dict(scale_factor=2, mode="nearest"), dict(size=(5, 7), mode="bilinear"),
                                dict(scale_factor=2.5, mode="bilinear"),
                                dict(size=(9, 4), mode="bilinear", align_corners=True)])
def test_interpolate_forward_backward_on_device(kw, monkeypatch):
    monkeypatch.setenv("TPUTOOL_FALLBACK", "error")
    run_both(lambda a: F.interpolate(a, **kw), torch.randn(2, 3, 4, 6))


@pytest.mark.parametrize("exponent", [2, 2.0, 3, -1.0, 0.5, 1.5, 0])
def test_pow_scalar_matches_cpu_and_whole_exponents_multiply(exponent):
    import jax

    from tputool.backend.lowerings.elementwise import pow_tensor_scalar

    x = torch.rand(5, 7) + 0.5
    torch.testing.assert_close((x.to("tpu") ** exponent).cpu(), x ** exponent)
    hlo = jax.jit(lambda a: pow_tensor_scalar(a, exponent)).lower(jax.numpy.ones((3,))).as_text()
    # exp(n * log(x)) is many times slower than n-1 multiplies; only a fractional exponent needs it
    assert ("power" in hlo) == (exponent == 1.5)
    i = torch.arange(-3, 4)
    torch.testing.assert_close((i.to("tpu") ** 2).cpu(), i ** 2)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_backward_as_one_elementwise_expression(reduction):
    """The lowered nll_loss backward (a one-hot from an iota, not a scatter) against CPU: class weights,
    ignored targets, 1-d / 2-d / spatial inputs."""
    torch.manual_seed(0)
    w = torch.rand(5)
    for shape, tshape in [((6, 5), (6,)), ((5,), ()), ((3, 5, 4), (3, 4)), ((2, 5, 3, 4), (2, 3, 4))]:
        t = torch.randint(0, 5, tshape)
        for weight in (None, w):
            for ignore in (-100, 2):
                run_both(lambda a, t=t, weight=weight, ignore=ignore: F.nll_loss(
                    a.log_softmax(1 if a.ndim > 1 else 0), t.to(a.device),
                    weight=None if weight is None else weight.to(a.device), reduction=reduction,
                    ignore_index=ignore), torch.randn(*shape))


def test_nll_loss_backward_computes_in_the_inputs_dtype():
    """No float64 anywhere in the lowered backward of a float32 loss (Python floats become float64 with x64 on:
    an (N, C) float64 select a TPU would have to emulate)."""
    import jax
    import jax.numpy as jnp

    from tputool.backend.lowerings import LOWERINGS

    fn = LOWERINGS[torch.ops.aten.nll_loss_backward.default].fn
    jaxpr = jax.make_jaxpr(lambda g, x, t: fn(g, x, t, None, 1, -100, jnp.float32(6)))(
        jnp.float32(1), jnp.zeros((6, 5), jnp.float32), jnp.zeros((6,), jnp.int64))
    assert "f64" not in str(jaxpr)


def _rnn_cases():
    """(name, module, input, initial state, indices of the outputs the loss reads)."""
    torch.manual_seed(0)
    x, xc = torch.randn(5, 3, 4), torch.randn(3, 4)
    h = (torch.randn(2, 3, 6), torch.randn(2, 3, 6))
    return [
        ("lstm", torch.nn.LSTM(4, 6, 2), x, h, (0, 1)),
        ("lstm_no_bias", torch.nn.LSTM(4, 6, 1, bias=False), x, None, (0,)),
        ("gru", torch.nn.GRU(4, 6, 2), x, h[0], (0, 1)),
        ("gru_no_bias_batch_first", torch.nn.GRU(4, 6, 1, bias=False, batch_first=True), x, None, (0,)),
        ("lstm_cell_cell_state_only", torch.nn.LSTMCell(4, 6), xc, (h[0][0], h[1][0]), (1,)),
        ("gru_cell", torch.nn.GRUCell(4, 6), xc, h[0][1], (0,)),
    ]


def _tensors(tree) -> list[torch.Tensor]:
    return [tree] if isinstance(tree, torch.Tensor) else [t for part in tree for t in _tensors(part)]


@pytest.mark.parametrize("case", range(6), ids=[c[0] for c in _rnn_cases()])
def test_rnn_modules_run_on_device_and_match_cpu(case, monkeypatch):
    """nn.LSTM/GRU and their cells: ATen calls the fused cell kernels (_thnn_fused_*) for accelerator tensors,
    which CPU lacks, so the CPU fallback could not run them (NotImplementedError). Outputs and the gradients
    of input, initial state and weights against CPU, with no op on the fallback; the LSTM cell's loss reads its
    cell state only (the backward's grad_hy is undefined)."""
    import copy

    monkeypatch.setenv("TPUTOOL_FALLBACK", "error")
    _, mod, x, state, read = _rnn_cases()[case]
    results = []
    for dev in ("cpu", T):
        m = copy.deepcopy(mod).to(dev)
        leaves = [t.detach().clone().to(dev).requires_grad_() for t in [x, *([] if state is None else _tensors(state))]]
        s = None if state is None else (tuple(leaves[1:]) if isinstance(state, tuple) else leaves[1])
        out = m(leaves[0], s)
        outs = _tensors([(out if isinstance(out, tuple) else (out,))[i] for i in read])
        loss = sum((o * torch.linspace(-1, 1, o.numel()).reshape(o.shape).to(dev)).sum() for o in outs)
        loss.backward()
        results.append([o.detach() for o in outs] + [t.grad for t in leaves] + [p.grad for p in m.parameters()])
    for got, ref in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got.cpu(), ref, atol=1e-5, rtol=1e-4)


def test_fused_lstm_cell_bfloat16_accumulates_in_float32():
    """As CUDA's kernel: bf16 gates in, the cell computed in float32, bf16 out (close to the float32 cell)."""
    torch.manual_seed(0)
    cell = torch.nn.LSTMCell(8, 16)
    x, h, c = torch.randn(4, 8), torch.randn(4, 16), torch.randn(4, 16)
    ref_h, ref_c = cell(x, (h, c))
    bf = [t.to(torch.bfloat16).to(T) for t in (x, h, c)]
    hy, cy = cell.to(torch.bfloat16).to(T)(bf[0], (bf[1], bf[2]))
    assert hy.dtype == cy.dtype == torch.bfloat16
    torch.testing.assert_close(hy.float().cpu(), ref_h.detach(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(cy.float().cpu(), ref_c.detach(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_mm_of_a_mixture_of_experts_matches_cpu(dtype, monkeypatch):
    """aten._grouped_mm (the MoE layers' expert products, input rows grouped by expert): lowered, with an empty
    group and transposed weights, no fallback (its per-prompt offsets made a new program per prompt there)."""
    monkeypatch.setenv("TPUTOOL_FALLBACK", "error")
    torch.manual_seed(0)
    x = torch.randn(12, 16).to(dtype)
    w = torch.randn(4, 8, 16).to(dtype).transpose(-2, -1)  # (G, K, N) as a transposed view, as HF's experts pass it
    offs = torch.tensor([3, 3, 10, 12], dtype=torch.int32)
    ref = torch._grouped_mm(x, w, offs)
    got = torch._grouped_mm(x.to(T), w.to(T), offs.to(T))
    assert got.dtype == dtype
    tol = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}
    torch.testing.assert_close(got.cpu(), ref, **tol)


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_safe_softmax_slice_backward_and_isin_are_lowered_and_match_cpu(mode, monkeypatch):
    """Ops a transformer step calls every step (attention's softmax, the gradient of a slice, HF's end-of-sequence
    check) run as one lowering each rather than PyTorch's decomposition re-dispatched op by op."""
    monkeypatch.setenv("TPUTOOL_FALLBACK", "error")
    old = torch.tpu.eager_mode()
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode))
    try:
        _lowered_transformer_ops()
    finally:
        torch.tpu.set_eager_mode(old)


def _lowered_transformer_ops():
    from tputool.backend import op_plan

    aten = torch.ops.aten
    for op in (aten._safe_softmax.default, aten.slice_backward.default, aten.isin.Tensor_Tensor):
        assert op_plan.plan(op).route is op_plan.Route.LOWERED
    x = torch.randn(2, 3, 5)
    x[0, 1] = float("-inf")  # a row that sees nothing: zeros, not NaN
    x[1, :, 2] = float("-inf")
    for args in ((x, -1), (x, 1), (x.to(torch.bfloat16), -1, torch.float32), (torch.tensor(float("-inf")), 0),
                 (torch.tensor(0.5), -1)):
        ref = aten._safe_softmax(*args)
        got = aten._safe_softmax(args[0].to(T), *args[1:])
        assert got.dtype == ref.dtype
        torch.testing.assert_close(got.cpu(), ref)
    g = torch.randn(4, 2, 6)
    for sizes, dim, start, end, step in (((4, 5, 6), 1, 1, 5, 2), ((4, 2, 9), -1, 3, 2**63 - 1, 1),
                                         ((7, 2, 6), 0, -4, 7, 1)):
        ref = aten.slice_backward(g, sizes, dim, start, end, step)
        torch.testing.assert_close(aten.slice_backward(g.to(T), sizes, dim, start, end, step).cpu(), ref)
    w = torch.randn(3, 8, requires_grad=True)
    (w[:, 2:7:2] * torch.arange(3.0)).sum().backward()
    wt = w.detach().to(T).requires_grad_(True)
    (wt[:, 2:7:2] * torch.arange(3.0).to(T)).sum().backward()
    torch.testing.assert_close(wt.grad.cpu(), w.grad)
    e, t = torch.tensor([[1, 5, 2], [7, 0, 5]]), torch.tensor([5, 7, 9], dtype=torch.int32)
    for kw in ({}, {"invert": True}, {"assume_unique": True}):
        ref = aten.isin(e, t, **kw)
        got = aten.isin(e.to(T), t.to(T), **kw)
        assert got.dtype == torch.bool
        torch.testing.assert_close(got.cpu(), ref)
    torch.testing.assert_close(aten.isin(torch.tensor(2.5).to(T), torch.tensor([2.5, 1.0]).to(T)).cpu(),
                               torch.tensor(True))


def _bits_equal(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal values, NaNs in the same places and zeros with the same signs."""
    nan = want.isnan()
    return bool(torch.equal(got.isnan(), nan) and torch.equal(got[~nan], want[~nan])
                and torch.equal(got[~nan].signbit(), want[~nan].signbit()))


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_lerp_matches_cpus_bits(mode):
    """lerp's two formulas (PyTorch's: `a + w*(b-a)` for |w| < 0.5, else `b - (b-a)*(1-w)`), with one weight or a
    tensor of weights, in place or not, equal CPU's results bit for bit: signed zeros, infinities and NaNs too
    (AdamW's moments are a lerp of the gradient)."""
    old = torch.tpu.eager_mode()
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode))
    try:
        g = torch.Generator().manual_seed(0)
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            a = torch.randn(300, generator=g).to(dtype)
            b = (torch.randn(300, generator=g) * 3).to(dtype)
            for w in (0.1, 0.5, 0.49, 0.9, -0.3, 1.7, 0.0, 1.0, float("nan")):
                assert _bits_equal(torch.lerp(a.to(T), b.to(T), w).cpu(), torch.lerp(a, b, w)), (dtype, w)
            wt = (torch.rand(300, generator=g) * 1.4 - 0.2).to(dtype)
            assert _bits_equal(torch.lerp(a.to(T), b.to(T), wt.to(T)).cpu(), torch.lerp(a, b, wt)), dtype
            x, y = a.clone(), a.to(T)
            x.lerp_(b, 0.1)
            y.lerp_(b.to(T), 0.1)
            assert _bits_equal(y.cpu(), x), dtype
        a = torch.tensor([0.0, -0.0, 1.0, -0.0, float("inf"), float("nan"), -0.0, 2.0])
        b = torch.tensor([-0.0, -0.0, 1.0, 0.0, 1.0, 1.0, -0.0, float("-inf")])
        for w in (1.0, 0.0, 0.5, 0.49, -0.0, float("nan"), float("inf"), 2.0):
            assert _bits_equal(torch.lerp(a.to(T), b.to(T), w).cpu(), torch.lerp(a, b, w)), w
    finally:
        torch.tpu.set_eager_mode(old)
