"""torch.tpu's submodules (pallas, ops, distributed, optimizers, compiler, profiler), against CPU references."""

from __future__ import annotations

import copy
import functools
import importlib
import re

import jax
import jax.numpy as jnp
import pytest
import torch
import torch.nn.functional as F

import tputool.backend  # noqa: F401 - registers the device

SUBMODULE_NAMES = {
    "compiler": "custom_compiler_options",
    "distributed": "set_tpu_launch_env spmd_safe topology_aware_mesh window_num_stripes window_stripe_chunk_mb",
    "ops": "align_jagged_to_multiple all_gather_dim grouped_matmul max_pool1d max_pool1d_backward max_pool2d max_pool2d_backward "
           "max_pool3d max_pool3d_backward optimization_barrier ragged_all_to_all ragged_dot ragged_dot_weight_grad "
           "recv reduce_scatter_dim send sparse_dense_matmul sparse_gather sparse_iota sparse_map_row splash_sdpa "
           "strip_jagged_padding",
    "optimizers": "AdamW Muon Optimizer Sgd SingleTraceTrainer",
    "pallas": "get_pallas_mesh jax_op",
    "profiler": "TpuProfilerConfig",
}
"""The public names of TorchTPU's submodules (../shared/reference/torchtpu-api.md)."""


@pytest.fixture
def fused(tpu_device: str):
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    yield
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)


def _tpu(*ts: torch.Tensor, grad: bool = False) -> list[torch.Tensor]:
    return [t.detach().to("tpu").requires_grad_(grad) for t in ts]


def _close(a: torch.Tensor, b: torch.Tensor, tol: float = 1e-5) -> None:
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=tol, atol=tol)


# ---- the modules ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sub", sorted(SUBMODULE_NAMES))
def test_submodule_is_importable_every_way_with_every_name(sub):
    mod = getattr(torch.tpu, sub)
    assert importlib.import_module(f"torch.tpu.{sub}") is mod
    assert getattr(__import__("torch.tpu", fromlist=[sub]), sub) is mod  # from torch.tpu import <sub>
    missing = [n for n in SUBMODULE_NAMES[sub].split() if not hasattr(mod, n)]
    assert missing == []


def test_import_statement_binds_torch_tpu_submodule():
    import torch.tpu.pallas

    assert torch.tpu.pallas.jax_op is torch.tpu.pallas.jax_op


# ---- pallas.jax_op ----------------------------------------------------------------------------------

def _jax_fn(a, b, scale):
    h = jnp.tanh(a @ b) * scale
    return {"h": h, "norm": (a * a).sum()}


def _torch_fn(a, b, scale):
    return {"h": torch.tanh(a @ b) * scale, "norm": (a * a).sum()}


def test_jax_op_values_and_gradients_match_torch_autograd(tpu_device):
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    ref_a, ref_b = a.clone().requires_grad_(), b.clone().requires_grad_()
    ta, tb = _tpu(a, b, grad=True)
    out = torch.tpu.pallas.jax_op(_jax_fn, ta, tb, scale=2.5)
    ref = _torch_fn(ref_a, ref_b, 2.5)
    assert set(out) == {"h", "norm"} and out["h"].device.type == "tpu"
    _close(out["h"], ref["h"], 1e-12)
    _close(out["norm"], ref["norm"], 1e-12)
    g = torch.randn(3, 5, dtype=torch.float64)
    (out["h"] * g.to("tpu")).sum().add(out["norm"] * 3).backward()
    (ref["h"] * g).sum().add(ref["norm"] * 3).backward()
    _close(ta.grad, ref_a.grad, 1e-12)
    _close(tb.grad, ref_b.grad, 1e-12)


def test_jax_op_only_one_output_used_and_no_grad_path(tpu_device):
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    ref_a = a.clone().requires_grad_()
    (ta,) = _tpu(a, grad=True)
    (tb,) = _tpu(b)
    torch.tpu.pallas.jax_op(_jax_fn, ta, tb, scale=1.0)["norm"].backward()  # "h" gets no gradient
    _torch_fn(ref_a, b, 1.0)["norm"].backward()
    _close(ta.grad, ref_a.grad)
    assert tb.grad is None
    with torch.no_grad():
        out = torch.tpu.pallas.jax_op(_jax_fn, ta, tb, scale=1.0)
    assert out["h"].grad_fn is None


def test_jax_op_integer_inputs_and_outputs_get_no_gradient(tpu_device):
    x = torch.randn(6)
    idx = torch.tensor([4, 0, 2])
    (tx,) = _tpu(x, grad=True)
    vals, arg = torch.tpu.pallas.jax_op(lambda v, i: (v[i] * 2, jnp.argmax(v)), tx, idx.to("tpu"))
    assert arg.dtype == torch.int64 and not arg.requires_grad and int(arg) == int(x.argmax())
    vals.sum().backward()
    ref = torch.zeros(6)
    ref[idx] = 2
    _close(tx.grad, ref)


def test_jax_op_in_fused_mode_reads_pending_values(fused):
    x = torch.randn(4, 4)
    tx = x.to("tpu") * 3 + 1  # deferred
    y = torch.tpu.pallas.jax_op(jnp.sin, tx)
    _close(y * 2, torch.sin(x * 3 + 1) * 2)


def _jf(h, w, scale):
    return {"a": jnp.sin(h) * scale, "b": (jnp.argmax(h, -1), (h * h).sum() * w.sum())}


def _tf(h, w, scale):
    return {"a": torch.sin(h) * scale, "b": (torch.argmax(h, -1), (h * h).sum() * w.sum())}


def test_jax_op_in_compiled_function_is_one_graph_with_backward(tpu_device):
    from tputool.backend import events

    torch.manual_seed(0)
    lin, w = torch.nn.Linear(4, 4), torch.randn(2)
    lin_t, (w_t,) = copy.deepcopy(lin).to("tpu"), _tpu(w, grad=True)
    w.requires_grad_()

    def step(m, x, w, op):
        out = op(m(x), w, scale=2.0)
        return (m(out["a"]) ** 2).sum() + out["b"][1], out["b"][0]

    x = torch.randn(3, 4)
    loss, idx = step(lin, x, w, _tf)
    loss.backward()
    events.reset()
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_NEVER):  # (Dynamo runs eagerly under Fused's mode)
        loss_t, idx_t = torch.compile(step, backend="tpu")(
            lin_t, x.to("tpu"), w_t, functools.partial(torch.tpu.pallas.jax_op, _jf))
        loss_t.backward()
    assert events.total("graph_break") == 0  # the JAX function is an op of the compiled graph
    assert events.total("compile") >= 2  # (a forward and a backward graph)
    _close(loss_t, loss)
    assert torch.equal(idx_t.cpu(), idx)
    _close(w_t.grad, w.grad)
    _close(lin_t.weight.grad, lin.weight.grad)


def test_jax_op_compiled_with_changing_sizes(tpu_device):
    f = torch.compile(lambda x: torch.tpu.pallas.jax_op(jnp.sin, x * 2) + 1, backend="tpu")
    for n in (3, 5, 7):  # (dynamic sizes after the first change: a graph break around jax_op, same values)
        x = torch.randn(n, 4)
        _close(f(x.to("tpu")), torch.sin(x * 2) + 1)


def test_jax_op_graph_op_kernels_under_another_backend(tpu_device):
    x = torch.randn(5)
    (tx,) = _tpu(x, grad=True)
    rx = x.clone().requires_grad_()
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_NEVER):  # backend "eager" runs tputool::jax_op's kernels
        out = torch.compile(lambda t: torch.tpu.pallas.jax_op(_jf, t, t, scale=3.0)["a"].sum(), backend="eager")(tx)
        out.backward()
    ref = _tf(rx, rx, 3.0)["a"].sum()
    ref.backward()
    _close(out, ref)
    _close(tx.grad, rx.grad)


def test_jax_op_cache_lets_functions_go(tpu_device):
    import gc

    from tputool.backend.tpu_api import pallas

    x = torch.ones(3, device="tpu")
    before = len(pallas._by_fn)
    for _ in range(3):
        _close(torch.tpu.pallas.jax_op(lambda a: a + 1.5, x), torch.full((3,), 2.5))
    gc.collect()
    assert len(pallas._by_fn) == before
    fn = jnp.cos
    torch.tpu.pallas.jax_op(fn, x)
    torch.tpu.pallas.jax_op(fn, x)
    assert len(pallas._by_fn[fn]) == 1  # one entry per (static arguments, compiler options)


def test_jax_op_refuses_cpu_tensors_and_unhashable_static(tpu_device):
    with pytest.raises(ValueError, match="takes tpu tensors, got a tensor on cpu"):
        torch.tpu.pallas.jax_op(jnp.sin, torch.ones(2))
    with pytest.raises(TypeError, match="must be hashable"):
        torch.tpu.pallas.jax_op(lambda a, w: a * w, torch.ones(2, device="tpu"), w=[1, 2])


def test_get_pallas_mesh_spans_every_device(tpu_device):
    mesh = torch.tpu.pallas.get_pallas_mesh()
    assert isinstance(mesh, jax.sharding.Mesh) and mesh.devices.size == jax.device_count()
    assert torch.tpu.pallas.get_pallas_mesh() is mesh


# ---- ops ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal", [False, True])
def test_splash_sdpa_matches_sdpa_values_and_gradients(tpu_device, causal):
    q, k, v = (torch.randn(1, 2, 128, 64) for _ in range(3))
    tq, tk, tv = _tpu(q, k, v, grad=True)
    rq, rk, rv = (t.clone().requires_grad_() for t in (q, k, v))
    out = torch.tpu.ops.splash_sdpa(tq, tk, tv, is_causal=causal)
    ref = F.scaled_dot_product_attention(rq, rk, rv, is_causal=causal)
    _close(out, ref, 1e-4)
    g = torch.randn_like(ref)
    out.backward(g.to("tpu"))
    ref.backward(g)
    for a, b in ((tq, rq), (tk, rk), (tv, rv)):
        _close(a.grad, b.grad, 1e-4)


def test_splash_sdpa_grouped_heads_scale_and_shape_errors(tpu_device):
    q, k, v = torch.randn(2, 4, 128, 64), torch.randn(2, 2, 256, 64), torch.randn(2, 2, 256, 64)
    out = torch.tpu.ops.splash_sdpa(*_tpu(q, k, v), scale=0.3)
    _close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True), 1e-4)
    with pytest.raises(ValueError, match="multiples of 128"):
        torch.tpu.ops.splash_sdpa(*_tpu(q[:, :, :100], k, v))
    with pytest.raises(ValueError, match="must divide query heads"):
        torch.tpu.ops.splash_sdpa(*_tpu(q[:, :3], k, v))


def _ragged_ref(lhs, rhs, sizes):
    out, start = torch.zeros(lhs.shape[0], rhs.shape[-1], dtype=lhs.dtype), 0
    for i, n in enumerate(sizes.tolist()):
        out[start:start + n] = lhs[start:start + n] @ rhs[i]
        start += n
    return out


def test_ragged_dot_and_its_weight_gradient(tpu_device):
    lhs, rhs, sizes = torch.randn(10, 4), torch.randn(3, 4, 5), torch.tensor([3, 0, 5])  # 2 rows past the groups
    tl, tr = _tpu(lhs, rhs, grad=True)
    rl, rr = lhs.clone().requires_grad_(), rhs.clone().requires_grad_()
    out = torch.tpu.ops.ragged_dot(tl, tr, sizes.to("tpu"))
    ref = _ragged_ref(rl, rr, sizes)
    _close(out, ref)
    g = torch.randn(10, 5)
    out.backward(g.to("tpu"))
    ref.backward(g)
    _close(tl.grad, rl.grad)
    _close(tr.grad, rr.grad)
    _close(torch.tpu.ops.ragged_dot_weight_grad(*_tpu(lhs, g, sizes)), rr.grad)


def test_collectives_along_a_dim_in_one_process(tpu_device, monkeypatch):
    x = torch.randn(4, 6)
    (tx,) = _tpu(x)
    for fn in (torch.tpu.ops.all_gather_dim, torch.tpu.ops.reduce_scatter_dim):
        out = fn(tx, 1)
        assert out is not tx
        _close(out, x)
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 4)
    with pytest.raises(ValueError, match="dimension 1 of size 6 does not split into 4 equal parts"):
        torch.tpu.ops.reduce_scatter_dim(tx, 1)  # (across processes: tests/backend/fixtures/dist_worker.py)


def test_optimization_barrier_keeps_values_and_structure(tpu_device):
    a, b = torch.randn(3), torch.randn(2, 2)
    out = torch.tpu.ops.optimization_barrier([*_tpu(a, b)])
    assert isinstance(out, list) and len(out) == 2
    _close(out[0], a)
    _close(out[1], b)
    _close(torch.tpu.ops.optimization_barrier(*_tpu(a)), a)


@pytest.mark.parametrize(("n", "kw"), [
    (1, {"kernel_size": 3, "stride": 2, "padding": 1}),
    (2, {"kernel_size": 3}),
    (2, {"kernel_size": (3, 2), "stride": 2, "padding": 1, "ceil_mode": True}),
    (2, {"kernel_size": 2, "stride": (2, 3), "dilation": 2, "ceil_mode": True}),
    (3, {"kernel_size": 2, "stride": 1, "padding": (1, 0, 1)}),
])
def test_max_pool_matches_torch_with_backward(tpu_device, n, kw):
    x = torch.randn(2, 3, *(9, 11, 7)[:n])
    x[0, 0, ..., 0] = 5.0  # ties: the gradient goes to the first maximum, as in PyTorch
    rx = x.clone().requires_grad_()
    (tx,) = _tpu(x, grad=True)
    pool, back = getattr(torch.tpu.ops, f"max_pool{n}d"), getattr(torch.tpu.ops, f"max_pool{n}d_backward")
    ref = getattr(F, f"max_pool{n}d")(rx, **kw)
    out = pool(tx, **kw)
    assert out.shape == ref.shape
    _close(out, ref)
    g = torch.randn_like(ref)
    ref.backward(g)
    out.backward(g.to("tpu"))
    _close(tx.grad, rx.grad)
    _close(back(g.to("tpu"), x.to("tpu"), **kw), rx.grad)


def test_ops_are_ops_of_compiled_graphs(tpu_device):
    from tputool.backend import events

    q, k, v = (torch.randn(1, 2, 128, 64) for _ in range(3))
    lhs, rhs, sizes = torch.randn(10, 4), torch.randn(3, 4, 5), torch.tensor([3, 0, 5])
    x = torch.randn(1, 2, 8, 8)
    (trhs,) = _tpu(rhs, grad=True)
    rrhs = rhs.clone().requires_grad_()
    events.reset()
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        att = torch.compile(lambda q, k, v: torch.tpu.ops.splash_sdpa(q, k, v, is_causal=True) * 2,
                            backend="tpu")(*_tpu(q, k, v))
        rag = torch.compile(lambda a, b, c: torch.tpu.ops.ragged_dot(a, b, c).square().sum(),
                            backend="tpu")(lhs.to("tpu"), trhs, sizes.to("tpu"))
        rag.backward()
        pool = torch.compile(lambda x: torch.tpu.ops.max_pool2d(x, 3, 2) + 1, backend="tpu")(x.to("tpu"))
    assert events.total("graph_break") == 0
    _close(att, F.scaled_dot_product_attention(q, k, v, is_causal=True) * 2, 1e-4)
    ref = _ragged_ref(lhs, rrhs, sizes).square().sum()
    ref.backward()
    _close(rag, ref)
    _close(trhs.grad, rrhs.grad)
    _close(pool, F.max_pool2d(x, 3, 2) + 1)


@pytest.mark.parametrize(("mod", "name", "why"), [
    ("ops", "sparse_dense_matmul", "SparseCore"), ("ops", "sparse_gather", "SparseCore"),
    ("ops", "sparse_iota", "SparseCore"), ("ops", "sparse_map_row", "SparseCore"),
    ("ops", "send", "one process"), ("ops", "recv", "one process"), ("ops", "ragged_all_to_all", "one process"),
    ("ops", "align_jagged_to_multiple", "jagged"), ("ops", "strip_jagged_padding", "jagged"),
    ("distributed", "spmd_safe", "multi-process"), ("distributed", "window_num_stripes", "multi-process"),
    ("distributed", "window_stripe_chunk_mb", "multi-process"),
    ("optimizers", "SingleTraceTrainer", "torch.compile"),
])
def test_names_without_a_meaning_here_say_why(mod, name, why):
    with pytest.raises(NotImplementedError, match=rf"torch\.tpu\.{mod}\.{name} is not available .*{why}"):
        getattr(getattr(torch.tpu, mod), name)(torch.ones(1))


# ---- optimizers ---------------------------------------------------------------------------------------

OPTIMIZERS = [
    ("AdamW", torch.optim.AdamW, {"lr": 0.05}),
    ("AdamW", torch.optim.AdamW, {"lr": 0.05, "betas": (0.8, 0.99), "weight_decay": 0.1, "amsgrad": True,
                                  "maximize": True}),
    ("Sgd", torch.optim.SGD, {"lr": 0.1}),
    ("Sgd", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("Sgd", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "dampening": 0.3, "maximize": True}),
]


def _models():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return m, copy.deepcopy(m).to("tpu")


@pytest.mark.parametrize(("name", "ref_cls", "kw"), OPTIMIZERS)
def test_optimizer_matches_torch_optim_over_steps_with_a_schedule(tpu_device, name, ref_cls, kw):
    m, mt = _models()
    ref = ref_cls([{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": kw["lr"] / 2}], **kw)
    opt = getattr(torch.tpu.optimizers, name)(
        [{"params": mt[0].parameters()}, {"params": mt[2].parameters(), "lr": kw["lr"] / 2}], **kw)
    assert isinstance(opt, torch.optim.Optimizer)
    scheds = [torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.7) for o in (ref, opt)]
    compiles = []
    for _ in range(5):
        x = torch.randn(5, 4)
        for model, o, s, xx in ((m, ref, scheds[0], x), (mt, opt, scheds[1], x.to("tpu"))):
            o.zero_grad()
            model(xx).square().sum().backward()
            o.step()
            s.step()
        compiles.append(torch.tpu.optimizers._jitted(type(opt), True)._cache_size())
        for a, b in zip(m.parameters(), mt.parameters(), strict=True):
            _close(b, a, 1e-6)
    # the learning rate changes every step without recompiling (SGD's first step makes its momentum buffers)
    assert compiles[-1] == compiles[1]
    for key in ref.state[next(m.parameters())]:
        ours = opt.state[next(mt.parameters())][key]
        assert ours.device.type == ("cpu" if key == "step" else "tpu")
        _close(ours, ref.state[next(m.parameters())][key], 1e-5)  # (sums of gradients: tpu vs CPU backward)


@pytest.mark.parametrize("kw", [{"lr": 0.02}, {"lr": 0.05, "nesterov": False, "weight_decay": 0.0,
                                               "adjust_lr_fn": "match_rms_adamw"}])
def test_muon_matches_torch_optim_muon(tpu_device, kw):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Tanh(), torch.nn.Linear(16, 4, bias=False))
    mt = copy.deepcopy(m).to("tpu")
    ref, opt = torch.optim.Muon(m.parameters(), **kw), torch.tpu.optimizers.Muon(mt.parameters(), **kw)
    for _ in range(4):
        x = torch.randn(5, 8)
        for model, o, xx in ((m, ref, x), (mt, opt, x.to("tpu"))):
            o.zero_grad()
            model(xx).square().sum().backward()
            o.step()
        for a, b in zip(m.parameters(), mt.parameters(), strict=True):
            _close(b, a, 1e-6)  # (bf16 Newton-Schulz: every bf16 rounding as torch's, see Muon.xla_options)
    with pytest.raises(ValueError, match="only supports 2D parameters"):
        torch.tpu.optimizers.Muon([torch.nn.Parameter(torch.ones(3))])


def test_optimizer_step_is_one_donating_computation(tpu_device):
    from tputool.backend import events
    from tputool.backend import tensor as tt

    mt = torch.nn.Sequential(torch.nn.Linear(3, 7), torch.nn.Linear(7, 3)).to("tpu")  # (shapes of its own)
    opt = torch.tpu.optimizers.AdamW(mt.parameters(), lr=0.01)
    mt(torch.randn(2, 3, device="tpu")).sum().backward()
    events.reset()
    opt.step()
    assert events.counts[("compile", "torch.tpu.optimizers.AdamW")] == 1  # every parameter: one computation
    old = tt.to_jax(mt[0].weight)
    version = mt[0].weight._version
    events.reset()
    opt.step()
    assert events.total("compile") == 0
    assert old.is_deleted()  # the parameter's buffer was donated to the update
    assert mt[0].weight._version > version


def test_optimizer_state_dict_round_trip(tpu_device):
    _, mt = _models()
    opt = torch.tpu.optimizers.AdamW(mt.parameters(), lr=0.01)
    mt(torch.randn(2, 4, device="tpu")).sum().backward()
    opt.step()
    opt2 = torch.tpu.optimizers.AdamW(mt.parameters(), lr=0.01)
    opt2.load_state_dict(opt.state_dict())
    for p in mt.parameters():
        for key, v in opt.state[p].items():
            _close(opt2.state[p][key], v)
    opt2.step()  # continues from the loaded step counts
    assert float(opt2.state[mt[0].weight]["step"]) == 2.0


def test_optimizer_in_fused_mode(fused):
    m, mt = _models()
    ref, opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5), torch.tpu.optimizers.Sgd(
        mt.parameters(), lr=0.1, momentum=0.5)
    for _ in range(3):
        x = torch.randn(3, 4)
        for model, o, xx in ((m, ref, x), (mt, opt, x.to("tpu"))):
            o.zero_grad()
            model(xx).square().sum().backward()
            o.step()
    for a, b in zip(m.parameters(), mt.parameters(), strict=True):
        _close(b, a, 1e-6)


def test_optimizer_donation_spares_deferred_reads(fused):
    _, mt = _models()
    opt = torch.tpu.optimizers.AdamW(mt.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        mt(torch.randn(2, 4, device="tpu")).sum().backward()
        torch.tpu.synchronize()  # gradients and states concrete: the step itself flushes nothing
        before = mt[0].weight.detach().cpu()
        snap = mt[0].weight.detach() * 1  # deferred: reads the weight's buffer, which the step donates
        opt.step()
        _close(snap, before, 0)


def test_optimizer_rejects_bad_hyperparameters_and_cpu_parameters():
    p0 = [torch.nn.Parameter(torch.ones(1))]
    torch.tpu.optimizers.AdamW(p0, fused=True, foreach=False, capturable=True)  # torch.optim's flags: accepted
    with pytest.raises(ValueError, match="differentiable=True"):
        torch.tpu.optimizers.Sgd(p0, differentiable=True)
    with pytest.raises(TypeError, match="unexpected keyword"):
        torch.tpu.optimizers.Sgd(p0, momentum_typo=0.9)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        torch.tpu.optimizers.AdamW([torch.nn.Parameter(torch.ones(1))], lr=-1)
    with pytest.raises(ValueError, match="Nesterov"):
        torch.tpu.optimizers.Sgd([torch.nn.Parameter(torch.ones(1))], nesterov=True)
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    with pytest.raises(ValueError, match="takes tpu tensors"):
        torch.tpu.optimizers.Sgd([p]).step()


# ---- compiler, distributed, profiler -------------------------------------------------------------------

def test_custom_compiler_options_reach_compiled_computations(tpu_device):
    from tputool.backend.runtime import STATE

    x = torch.randn(4, device="tpu")
    # (Strict: under the Fused mode's dispatch mode Dynamo runs functions eagerly, compiling no graph)
    with torch.tpu.eager_mode(torch.tpu.EagerMode.DEFER_NEVER):
        with torch.tpu.compiler.custom_compiler_options({"xla_bogus_option_for_test": True}) as opts:
            assert opts == {"xla_bogus_option_for_test": True}
            with pytest.raises(Exception, match="No such compile option"):
                torch.tpu.pallas.jax_op(lambda a: a * 3.5, x)
            with pytest.raises(Exception, match="No such compile option"):
                torch.compile(lambda t: t * 4.5 + 1, backend="tpu")(x)
        assert STATE.compiler_options == {}
        with torch.tpu.compiler.custom_compiler_options(xla_backend_optimization_level=0):
            _close(torch.tpu.pallas.jax_op(lambda a: a * 3.5, x), x * 3.5)
            _close(torch.compile(lambda t: t * 5.5 + 1, backend="tpu")(x), x * 5.5 + 1)
    torch.tpu.compiler.custom_compiler_options(xla_backend_optimization_level=1)  # a plain call stays set
    assert STATE.compiler_options == {"xla_backend_optimization_level": 1}
    torch.tpu.compiler.custom_compiler_options(xla_backend_optimization_level=None)
    assert STATE.compiler_options == {}


def test_distributed_mesh_and_launch_env():
    mesh = torch.tpu.distributed.topology_aware_mesh()
    assert mesh.axis_names == ("data",) and mesh.devices.size == jax.device_count()
    env: dict[str, str] = {}
    out = torch.tpu.distributed.set_tpu_launch_env([0, 1], (1, 2, 1), "1,1,1", process_port=8476,
                                                   process_addresses=["localhost:8476", "localhost:8477"],
                                                   environ=env)
    assert env == out == {"TPU_VISIBLE_CHIPS": "0,1", "TPU_PROCESS_BOUNDS": "1,2,1",
                          "TPU_CHIPS_PER_PROCESS_BOUNDS": "1,1,1", "TPU_PROCESS_PORT": "8476",
                          "TPU_PROCESS_ADDRESSES": "localhost:8476,localhost:8477"}
    with pytest.raises(ValueError, match=re.escape("process_bounds must be 3 non-negative integers")):
        torch.tpu.distributed.set_tpu_launch_env("0", (1, 2), environ={})


def test_profiler_config_drives_capture(tmp_path):
    from tputool.profile import capture

    cfg = torch.tpu.profiler.TpuProfilerConfig(log_dir=str(tmp_path / "trace"), python_tracer=False,
                                                torch_trace=True, create_perfetto_trace=False)
    f = jax.jit(lambda v: jnp.sin(v) * 2)
    s = capture(lambda i: f(jnp.ones(8) + i), steps=2, config=cfg)
    assert (tmp_path / "trace" / "torch_trace.json").exists()
    assert s.xplane_path.startswith(str(tmp_path / "trace"))
    assert not list((tmp_path / "trace").rglob("perfetto_trace.json.gz"))
    with pytest.raises(ValueError, match="host_tracer_level"):
        torch.tpu.profiler.TpuProfilerConfig(host_tracer_level=7)
