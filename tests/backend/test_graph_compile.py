"""`torch.compile(backend="tpu")`: compiled == eager == CPU (forward and grads), mutations honoured, no
recompile on an identical call, graph breaks and recompiles recorded, default backend routing on tpu.

Each test runs on the tpu device and, where it says so, also on CPU tensors (backend "tpu" then runs the
graph through JAX on the host), which checks the graph path without the device.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounterWithBackend

from tputool.backend import events
from tputool.backend.graph import install
from tputool.models import MODELS

TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    install()
    torch._dynamo.reset()
    events.reset()
    yield
    torch._dynamo.reset()


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["mlp", "cnn", "llama", pytest.param("vit", marks=pytest.mark.slow),
                                  pytest.param("moe", marks=pytest.mark.slow)])
def test_forward_and_grads_match_eager_and_cpu(name: str, dev: str) -> None:
    spec = MODELS[name]
    cfg = spec.config(tie_embeddings=False) if name == "llama" else spec.config()
    torch.manual_seed(0)
    cpu_model = spec.build(cfg)
    x, y = spec.example_batch(cfg, 4, "cpu", torch.Generator().manual_seed(0))
    eager_model = copy.deepcopy(cpu_model).to(dev)
    compiled_model = copy.deepcopy(cpu_model).to(dev)
    compiled = torch.compile(compiled_model, backend="tpu")

    cpu_loss = spec.loss_fn(cpu_model(x), y)
    cpu_loss.backward()
    eager_loss = spec.loss_fn(eager_model(x.to(dev)), y.to(dev))
    eager_loss.backward()
    loss = spec.loss_fn(compiled(x.to(dev)), y.to(dev))
    loss.backward()

    torch.testing.assert_close(loss.detach().cpu(), cpu_loss.detach(), **TOL)
    torch.testing.assert_close(loss.detach().cpu(), eager_loss.detach().cpu(), **TOL)
    torch.testing.assert_close(_grads(compiled_model), _grads(cpu_model), **TOL)
    torch.testing.assert_close(_grads(compiled_model), _grads(eager_model), **TOL)
    assert events.total("compile") >= 2  # a forward and a backward computation


def test_input_and_buffer_mutation_is_honoured(dev: str) -> None:
    def step(x: torch.Tensor, acc: torch.Tensor) -> torch.Tensor:
        acc.add_(x)
        x.mul_(2)
        return x + acc

    x, acc = torch.ones(3, device=dev), torch.zeros(3, device=dev)
    f = torch.compile(step, backend="tpu")
    f(x, acc)
    out = f(x, acc)
    torch.testing.assert_close(x.cpu(), torch.full((3,), 4.0))
    torch.testing.assert_close(acc.cpu(), torch.full((3,), 3.0))
    torch.testing.assert_close(out.cpu(), torch.full((3,), 7.0))


def test_batchnorm_running_stats_are_updated(dev: str) -> None:
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6)).train()
    model = copy.deepcopy(ref).to(dev)
    compiled = torch.compile(model, backend="tpu")
    x = torch.randn(8, 4)
    for _ in range(2):
        torch.testing.assert_close(compiled(x.to(dev)).detach().cpu(), ref(x).detach(), **TOL)
    bn, ref_bn = model[1], ref[1]
    torch.testing.assert_close(bn.running_mean.cpu(), ref_bn.running_mean, **TOL)
    torch.testing.assert_close(bn.running_var.cpu(), ref_bn.running_var, **TOL)
    assert int(bn.num_batches_tracked.cpu()) == 2


def test_second_identical_call_does_not_recompile(dev: str) -> None:
    counter = CompileCounterWithBackend("tpu")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).to(dev)
    f = torch.compile(model, backend=counter)
    x = torch.randn(2, 4, device=dev)
    f(x)
    compiles = events.total("compile")
    with torch.compiler.set_stance("fail_on_recompile"):
        f(x)
        f(torch.randn(2, 4, device=dev))
    assert counter.frame_count == 1
    assert events.total("compile") == compiles


def test_graph_break_runs_eager_and_is_recorded(dev: str) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    x = torch.arange(3.0, device=dev)
    out = torch.compile(f, backend="tpu")(x)
    torch.testing.assert_close(out.cpu(), torch.arange(3.0) * 2 + 1)
    assert events.total("graph_break") == 1


def test_item_and_tensor_arguments_in_a_compiled_function_fall_back_to_eager(dev: str) -> None:
    # A graph break at .item() (a data-dependent branch, narrow with a tensor start) runs the device's kernels
    # as plain Python: Dynamo must not try to trace them (it used to, and failed on their first numpy call).
    def branch(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if y.sum().item() > 0:
            return y + 1
        return y - 1

    def narrow(x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return torch.narrow(x, 0, start, 2)

    x = torch.ones(3, device=dev)
    torch.testing.assert_close(torch.compile(branch, backend="tpu")(x).cpu(), torch.full((3,), 3.0))
    torch.testing.assert_close(torch.compile(narrow, backend="tpu")(torch.arange(5.0, device=dev),
                                                                     torch.tensor(1, device=dev)).cpu(),
                               torch.tensor([1.0, 2.0]))


@torch._dynamo.config.patch(automatic_dynamic_local_pgo=False)  # no dynamic-shape memory across tests
def test_shape_change_recompiles_with_its_guard_and_new_shapes_are_static(dev: str) -> None:
    f = torch.compile(lambda x: (x * 2).sum(0), backend="tpu")
    for n in (3, 4, 5):  # 4: Dynamo recompiles (guard); 5: symbolic sizes, a new static XLA computation
        torch.testing.assert_close(f(torch.ones(n, 2, device=dev)).cpu(), torch.full((2,), 2.0 * n))
    reasons = [d for (k, d), _ in events.counts.items() if k == "recompile"]
    assert any("size mismatch" in r for r in reasons), reasons


def test_default_backend_routes_tpu_inputs_to_tpu_backend(tpu_device: str) -> None:
    model = torch.nn.Linear(4, 2).to(tpu_device)
    x = torch.randn(3, 4)
    out = torch.compile(model)(x.to(tpu_device))
    torch.testing.assert_close(out.detach().cpu(), model.cpu()(x).detach(), **TOL)
    assert events.total("compile") >= 1


def test_inductor_mode_on_tpu_is_refused(tpu_device: str) -> None:
    f = torch.compile(lambda x: x + 1, mode="max-autotune")
    with pytest.raises(Exception, match="Inductor does not generate code for the tpu device"):
        f(torch.ones(2, device=tpu_device))


def test_compiled_adamw_step_matches_eager(dev: str) -> None:
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
    model = copy.deepcopy(ref).to(dev)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    step = torch.compile(opt.step, backend="tpu")  # the foreach ops become one computation
    x = torch.randn(5, 4)
    for _ in range(3):
        for m, o, s, inp in ((ref, opt_ref, opt_ref.step, x), (model, opt, step, x.to(dev))):
            o.zero_grad()
            m(inp).pow(2).sum().backward()
            s()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), **TOL)


def test_in_place_ops_dynamo_writes_as_fused_multiply_add_compile(dev: str) -> None:
    """Dynamo writes `addcmul_`/`addcdiv_` with a value and `add_` with a tensor alpha as inductor's `prims.fma`
    (nanochat's compiled AdamW step: "no JAX lowering for prims.fma.default")."""

    def step(p, m, g, lr):
        m.addcmul_(g, g, value=0.1)
        p.addcdiv_(g, m.sqrt() + 1.0, value=-0.5)
        p.add_(g, alpha=-lr)
        return p.mul(2)

    torch.manual_seed(0)
    p, m, g = torch.randn(16), torch.rand(16), torch.randn(16)
    lr = torch.tensor(0.25)
    want = [t.clone() for t in (p, m)]
    out_want = step(*want, g, lr)
    got = [t.to(dev) for t in (p, m)]
    out = torch.compile(step, backend="tpu", fullgraph=True)(*got, g.to(dev), lr)
    for a, b in zip((*got, out), (*want, out_want), strict=True):
        torch.testing.assert_close(a.cpu(), b, **TOL)


def test_mutated_input_still_referenced_elsewhere_is_not_donated(tpu_device: str) -> None:
    import jax

    from tputool.backend.tensor import to_jax

    p = torch.zeros(4).to(tpu_device)
    f = torch.compile(lambda t: t.mul_(2).add_(1), backend="tpu")
    f(p)
    kept = to_jax(p)  # someone else holds the buffer: the next step must not reuse it
    version = p._version
    f(p)
    assert not kept.is_deleted()
    torch.testing.assert_close(torch.from_numpy(jax.device_get(kept).copy()), torch.full((4,), 1.0))
    torch.testing.assert_close(p.cpu(), torch.full((4,), 3.0))
    assert p._version > version


def test_compiled_optimizer_keeps_step_counters_on_tpu(tpu_device: str) -> None:
    model = torch.nn.Linear(4, 2).to(tpu_device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = torch.compile(opt.step, backend="tpu")
    for _ in range(2):
        model(torch.ones(3, 4, device=tpu_device)).sum().backward()
        step()
    counters = [s["step"] for s in opt.state.values()]
    assert len(counters) == 2 and all(c.device.type == "tpu" for c in counters)
    assert [float(c) for c in counters] == [2.0, 2.0]


@pytest.mark.parametrize("fn, lo, hi", [(torch.rand_like, 0.0, 1.0), (torch.randn_like, -10.0, 10.0)])
def test_rand_like_compiles_and_keeps_eager_values(tpu_device: str, fn, lo: float, hi: float) -> None:
    x = torch.zeros(64, 8, device=tpu_device, dtype=torch.bfloat16)
    out = torch.compile(lambda t: t + fn(t), backend="tpu")(x).cpu()
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert lo <= float(out.min()) and float(out.max()) < hi and out.float().std() > 0.1
    # eager: the lowering draws what `empty_like(x).uniform_()` / `.normal_()` draws from the same seed
    fill = torch.Tensor.uniform_ if fn is torch.rand_like else torch.Tensor.normal_
    torch.manual_seed(3)
    a = fn(x, dtype=torch.float32).cpu()
    torch.manual_seed(3)
    b = fill(torch.empty_like(x, dtype=torch.float32)).cpu()
    torch.testing.assert_close(a, b, rtol=0, atol=0)
