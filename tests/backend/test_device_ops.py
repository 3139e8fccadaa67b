"""Ops real training code sends to the device, run there (no CPU fallback) with CPU's results: fused
optimizers (`fused=True`), GradScaler's AMP ops, histc (integer input too), and linalg/fft ops."""

from __future__ import annotations

import copy

import pytest
import torch

from tputool.backend import events

T = "tpu"
TOL = {"rtol": 1e-4, "atol": 1e-5}  # (test_training.py's: the model's matmuls differ from CPU's in the last bits)


@pytest.fixture
def no_fallback(tpu_device: str, monkeypatch) -> str:
    """The tpu device with the CPU fallback forbidden (an op that would take it raises)."""
    monkeypatch.setenv("TPUTOOL_FALLBACK", "error")
    events.reset()
    return tpu_device


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


OPTIMIZERS = {
    "adamw": lambda ps, dev: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw-amsgrad-maximize": lambda ps, dev: torch.optim.AdamW(ps, lr=1e-2, amsgrad=True, maximize=True,
                                                                fused=True),
    "adamw-tensor-lr": lambda ps, dev: torch.optim.AdamW(ps, lr=torch.tensor(1e-2, device=dev), fused=True),
    "adam-weight-decay": lambda ps, dev: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.1, betas=(0.8, 0.9),
                                                          fused=True),
    "adam-amsgrad": lambda ps, dev: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, eps=1e-6, fused=True),
    "sgd": lambda ps, dev: torch.optim.SGD(ps, lr=0.1, fused=True),
    "sgd-nesterov-weight-decay": lambda ps, dev: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True,
                                                                 weight_decay=0.01, fused=True),
    "sgd-dampening-maximize": lambda ps, dev: torch.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.3,
                                                              maximize=True, fused=True),
    "sgd-tensor-lr": lambda ps, dev: torch.optim.SGD(ps, lr=torch.tensor(0.1, device=dev), momentum=0.5,
                                                     fused=True),
}


def _train(make_opt, dev: str, steps: int = 3, scaler_args: dict | None = None, inf_at: int = -1) -> list:
    """Run `steps` optimizer steps on `dev` (changing a float lr between steps, as a scheduler does); return
    every parameter, gradient and optimizer state tensor after each step (and the scale, with a scaler)."""
    model = copy.deepcopy(_model()).to(dev)
    opt = make_opt(model.parameters(), dev)
    scaler = torch.amp.GradScaler(dev, **scaler_args) if scaler_args is not None else None
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1)).to(dev)
    seen = []
    for i in range(steps):
        opt.zero_grad()
        loss = model(x).pow(2).sum()
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
        if i == inf_at:
            with torch.no_grad():
                model[0].weight.grad[0, 0] = float("inf")
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
            seen.append(torch.tensor(scaler.get_scale()))
        for g in opt.param_groups:
            if not isinstance(g["lr"], torch.Tensor):
                g["lr"] *= 0.7
        seen += [p.detach().cpu().clone() for p in model.parameters()]
        seen += [p.grad.detach().cpu().clone() for p in model.parameters()]
        seen += [v.detach().cpu().clone() for s in opt.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor)]
    return seen


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_fused_optimizer_matches_cpu_on_the_device_as_one_computation(name: str, no_fallback: str) -> None:
    ref = _train(OPTIMIZERS[name], "cpu")
    got = _train(OPTIMIZERS[name], no_fallback)
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, **TOL)
    compiles = {d: n for (k, d), n in events.counts.items() if k == "compile" and "_fused_" in d}
    # One kernel per step signature (SGD's first step with momentum is another): a new lr compiles nothing.
    assert all(n <= (2 if "sgd" in name else 1) for n in compiles.values()), compiles


@pytest.mark.parametrize("name", ["sgd-plain", "adamw-fused", "sgd-fused-momentum"])
def test_grad_scaler_unscales_skips_an_inf_step_and_updates_the_scale(name: str, no_fallback: str) -> None:
    make = {
        "sgd-plain": lambda ps, dev: torch.optim.SGD(ps, lr=0.1),
        "adamw-fused": OPTIMIZERS["adamw"],  # the fused kernel takes grad_scale and found_inf itself
        "sgd-fused-momentum": lambda ps, dev: torch.optim.SGD(ps, lr=0.1, momentum=0.9, fused=True),
    }[name]
    args = {"init_scale": 2.0**10, "growth_interval": 2, "growth_factor": 4.0, "backoff_factor": 0.25}
    ref = _train(make, "cpu", steps=5, scaler_args=args, inf_at=2)
    got = _train(make, no_fallback, steps=5, scaler_args=args, inf_at=2)
    assert [float(v) for v in got[:: len(got) // 5]] == [float(v) for v in ref[:: len(ref) // 5]]
    for g, r in zip(got, ref, strict=True):
        torch.testing.assert_close(g, r, **TOL)


def test_amp_ops_directly(no_fallback: str) -> None:
    grads = [torch.tensor([1.0, 2.0]), torch.tensor([[4.0, float("nan")]]), torch.tensor([3.0])]
    for found in (0.0, 1.0):
        out = {}
        for dev in ("cpu", no_fallback):
            gs = [g.clone().to(dev) for g in (grads[::2] if found == 0.0 else grads)]
            f = torch.tensor([0.0], device=dev)
            torch._amp_foreach_non_finite_check_and_unscale_(gs, f, torch.tensor([0.5], device=dev))
            scale, tracker = torch.tensor([8.0], device=dev), torch.tensor([1], dtype=torch.int32, device=dev)
            r = torch._amp_update_scale_(scale, tracker, f, 2.0, 0.5, 2)
            assert r is scale
            out[dev] = [t.cpu() for t in (*gs, f, scale, tracker)]
        for g, r in zip(out[no_fallback], out["cpu"], strict=True):
            torch.testing.assert_close(g, r, equal_nan=True)
        assert float(out["cpu"][-3]) == found


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_histc_on_integers_counts_as_cuda_does(dtype: torch.dtype, no_fallback: str) -> None:
    x = torch.tensor([0, 1, 2, 2, 3, 4, 5, 7, 9, 3], dtype=dtype)
    got = torch.histc(x.to(no_fallback), bins=4, min=0, max=7)
    # CUDA: bin = (x - min) * bins // (max - min), x == max in the last bin, values outside [min, max] ignored
    assert got.dtype == dtype
    assert got.cpu().tolist() == [2, 4, 2, 1]
    # Mixtral/Qwen3-MoE routing: tokens per expert
    experts = torch.tensor([[0, 3], [1, 3], [3, 2], [0, 1]], dtype=dtype)
    per_expert = torch.histc(experts.to(no_fallback), bins=4, min=0, max=3)
    assert per_expert.cpu().tolist() == [2, 2, 1, 3]
    # min == max: the data's range
    assert torch.histc(x.to(no_fallback), bins=3).cpu().tolist() == [4, 4, 2]
    assert torch.histc(torch.full((3,), 5, dtype=dtype).to(no_fallback), bins=2).cpu().tolist() == [0, 3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_histc_on_floats_matches_cpu(dtype: torch.dtype, no_fallback: str) -> None:
    x = torch.cat([torch.randn(200, generator=torch.Generator().manual_seed(0)),
                   torch.tensor([-1.0, 1.0, 0.0, 0.999999, -3.0, 3.0])]).to(dtype)
    for kwargs in ({"bins": 10, "min": -1, "max": 1}, {"bins": 7}, {"bins": 1, "min": 0.5, "max": 0.5},
                   {"bins": 13, "min": -2.5, "max": 0.25}):
        got = torch.histc(x.to(no_fallback), **kwargs)
        torch.testing.assert_close(got.cpu(), torch.histc(x, **kwargs), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x.to(no_fallback), bins=3, min=2, max=1)


@pytest.fixture
def fuse_mode(no_fallback: str):
    from tputool.backend import fused as engine

    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    yield engine
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)


def test_fused_mode_records_each_fused_op_as_one_node(fuse_mode, no_fallback: str) -> None:
    args = {"init_scale": 2.0**10, "growth_interval": 2}
    for make in (OPTIMIZERS["adamw-amsgrad-maximize"], OPTIMIZERS["sgd-nesterov-weight-decay"]):
        ref = _train(make, "cpu", steps=4, scaler_args=args, inf_at=1)
        got = _train(make, no_fallback, steps=4, scaler_args=args, inf_at=1)
        for g, r in zip(got, ref, strict=True):
            torch.testing.assert_close(g, r, **TOL)
    reasons = [d for (k, d), _ in events.counts.items() if k == "flush"]
    assert not [d for d in reasons if "no lowering" in d or "could not defer" in d], reasons
    ps = [torch.ones(3, device=no_fallback), torch.ones(2, 2, device=no_fallback)]
    grads = [torch.full_like(p, 0.5) for p in ps]
    fuse_mode.flush("test")
    torch._fused_sgd_(ps, grads, [], weight_decay=0.0, momentum=0.0, lr=0.1, dampening=0.0, nesterov=False,
                      maximize=False, is_first_step=False)
    assert len(fuse_mode.TRACE.nodes) == 1
    torch.testing.assert_close(ps[1].cpu(), torch.full((2, 2), 0.95))


def test_compiled_step_of_a_fused_optimizer_matches_cpu(no_fallback: str) -> None:
    from tputool.backend.graph import install

    install()
    torch._dynamo.reset()
    ref, model = _model(), _model().to(no_fallback)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True)
    step = torch.compile(opt.step, backend="tpu")
    x = torch.randn(4, 5)
    try:
        for _ in range(3):
            for m, o, s, inp in ((ref, opt_ref, opt_ref.step, x), (model, opt, step, x.to(no_fallback))):
                o.zero_grad()
                m(inp).pow(2).sum().backward()
                s()
    finally:
        torch._dynamo.reset()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), **TOL)
    assert events.total("graph_break") == 0


FFTS = {
    "fft": lambda x, z: torch.fft.fft(x),
    "ifft-real": lambda x, z: torch.fft.ifft(x),
    "rfft-ortho": lambda x, z: torch.fft.rfft(x, norm="ortho"),
    "irfft-n": lambda x, z: torch.fft.irfft(z, n=7),
    "fft2-complex-forward": lambda x, z: torch.fft.fft2(z, norm="forward"),
    "ifftn-dims": lambda x, z: torch.fft.ifftn(z, dim=(0, 2)),
    "rfftn": lambda x, z: torch.fft.rfftn(x),
    "irfft2": lambda x, z: torch.fft.irfft2(z),
    "hfft": lambda x, z: torch.fft.hfft(z),
    "ihfft": lambda x, z: torch.fft.ihfft(x),
    "stft": lambda x, z: torch.stft(x.flatten(), 8, hop_length=2, window=torch.hann_window(8, device=x.device),
                                    return_complex=True),
}


@pytest.mark.parametrize("name", list(FFTS))
def test_fft_runs_on_the_device_with_cpus_results(name: str, no_fallback: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 6, generator=g)
    z = torch.complex(torch.randn(3, 4, 6, generator=g), torch.randn(3, 4, 6, generator=g))
    ref = FFTS[name](x, z)
    got = FFTS[name](x.to(no_fallback), z.to(no_fallback))
    assert got.dtype == ref.dtype
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-4, atol=1e-4)


def test_conjugate_and_negative_views_read_resolved(no_fallback: str) -> None:
    z = torch.complex(torch.randn(5), torch.randn(5))
    t = z.to(no_fallback)
    for fn in (lambda a: a.conj(), lambda a: a.conj()[1:4], lambda a: a.conj().imag, lambda a: a.conj().clone(),
               lambda a: torch.view_as_real(a.conj().resolve_conj()), lambda a: torch.view_as_complex(
                   torch.view_as_real(a) * 2)):
        got, ref = fn(t), fn(z)
        assert got.is_conj() == ref.is_conj() and got.is_neg() == ref.is_neg()
        torch.testing.assert_close(got.cpu(), ref.resolve_conj().resolve_neg())
    out = torch.zeros(5, dtype=torch.complex64, device=no_fallback)
    out.copy_(t.conj())
    torch.testing.assert_close(out.cpu(), z.conj().resolve_conj())


def _spd(n: int, batch: tuple = ()) -> torch.Tensor:
    a = torch.randn(*batch, n, n, generator=torch.Generator().manual_seed(3))
    return a @ a.mT + n * torch.eye(n)


LINALG = {
    "det": lambda a, b: torch.linalg.det(a),
    "det-transposed": lambda a, b: torch.linalg.det(a.mT),
    "slogdet": lambda a, b: torch.linalg.slogdet(a - 3 * torch.eye(4, device=a.device)).logabsdet,
    "logdet": lambda a, b: torch.logdet(a.mT),
    "solve": lambda a, b: torch.linalg.solve(a, b),
    "solve-vector": lambda a, b: torch.linalg.solve(a, b[..., 0]),
    "solve-right": lambda a, b: torch.linalg.solve(a, b.mT, left=False),
    "lu_solve-adjoint": lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b, adjoint=True),
    "lu_solve-right": lambda a, b: torch.linalg.lu_solve(*torch.linalg.lu_factor(a), b.mT, left=False),
    "lu": lambda a, b: torch.cat(torch.linalg.lu(a), -1),
    "lu_unpack": lambda a, b: torch.cat([x.flatten(1) for x in torch.lu_unpack(*torch.linalg.lu_factor(a[..., :3]))],
                                        -1),
    "cholesky": lambda a, b: torch.cholesky(a, upper=True),
    "cholesky_solve": lambda a, b: torch.cholesky_solve(b, torch.linalg.cholesky(a)),
    "cholesky_inverse": lambda a, b: torch.cholesky_inverse(torch.linalg.cholesky(a)),
    "triangular_solve": lambda a, b: torch.triangular_solve(b, a.triu(), transpose=True).solution,
    "householder_product": lambda a, b: torch.linalg.householder_product(a, b[..., 0]),
    "geqrf-ormqr": lambda a, b: torch.ormqr(*torch.geqrf(a), b, transpose=True),
}


@pytest.mark.parametrize("name", list(LINALG))
def test_linalg_runs_on_the_device_with_cpus_values_and_gradients(name: str, no_fallback: str) -> None:
    a, b = _spd(4, (2,)), torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(4))
    ca, cb = a.clone().requires_grad_(), b.clone().requires_grad_()
    ta, tb = a.to(no_fallback).requires_grad_(), b.to(no_fallback).requires_grad_()
    ref, got = LINALG[name](ca, cb), LINALG[name](ta, tb)
    torch.testing.assert_close(got.cpu(), ref.detach(), rtol=1e-4, atol=1e-4)
    if name in ("lu", "lu_unpack", "geqrf-ormqr"):  # (factorizations: values only)
        return
    ref.sum().backward()
    got.sum().backward()
    for t, c in ((ta, ca), (tb, cb)):
        if c.grad is not None:
            torch.testing.assert_close(t.grad.cpu(), c.grad, rtol=1e-3, atol=1e-3)


def test_singular_values_and_eigenvalues_without_grad_run_on_the_device(no_fallback: str) -> None:
    a = _spd(5, (3,))
    with torch.no_grad():
        torch.testing.assert_close(torch.linalg.svdvals(a.to(no_fallback)).cpu(), torch.linalg.svdvals(a))
        torch.testing.assert_close(torch.linalg.eigvalsh(a.to(no_fallback), UPLO="U").cpu(),
                                   torch.linalg.eigvalsh(a, UPLO="U"))
        info = torch.linalg.lu_factor_ex(torch.zeros(3, 3, device=no_fallback)).info
        assert info.cpu().tolist() == torch.linalg.lu_factor_ex(torch.zeros(3, 3)).info.tolist()


def test_compiled_det_of_a_view_never_gives_another_gradient(no_fallback: str) -> None:
    """det/slogdet return LU factors that depend on A's layout (eager reads it); a graph, which cannot, refuses."""
    from tputool.backend.graph import install

    install()
    torch._dynamo.reset()
    a = _spd(4)
    ref = a.clone().requires_grad_()
    torch.linalg.det(ref.mT).backward()
    x = a.to(no_fallback).requires_grad_()
    try:
        torch.compile(lambda t: torch.linalg.det(t.mT), backend="tpu")(x).backward()
    except Exception as e:  # noqa: BLE001 - a refusal is the other allowed outcome
        assert "no JAX lowering for aten._linalg_det" in str(e)
        return
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(x.grad.cpu(), ref.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["adamw-amsgrad-maximize", "sgd-nesterov-weight-decay"])
def test_fused_optimizer_on_bfloat16_does_float32_math(name: str, no_fallback: str) -> None:
    """bf16 parameters step in float32 and are rounded once (the reference: float32 on CPU from the same bf16
    values; PyTorch 2.13's own CPU fused SGD kernel is off for bf16 tensors of 16+ elements)."""
    g = torch.Generator().manual_seed(5)
    vals = [torch.randn(40, generator=g).to(torch.bfloat16) for _ in range(2)]
    grads = [torch.randn(40, generator=g).to(torch.bfloat16) for _ in range(2)]

    def run(dev: str, dtype: torch.dtype) -> list:
        ps = [v.to(dev, dtype).requires_grad_() for v in vals]
        opt = OPTIMIZERS[name](ps, dev)
        for _ in range(2):
            for p, gr in zip(ps, grads, strict=True):
                p.grad = gr.to(dev, dtype)
            opt.step()
        return [p.detach().cpu().float() for p in ps]

    for got, ref in zip(run(no_fallback, torch.bfloat16), run("cpu", torch.float32), strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-2, atol=1e-2)  # (bf16 storage: ~3 significant digits)


def test_fft_and_conjugate_views_in_fused_mode(fuse_mode, no_fallback: str) -> None:
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(6))
    t = x.to(no_fallback)
    torch.testing.assert_close(torch.fft.ifft(t * 2).cpu(), torch.fft.ifft(x * 2))
    z, ref = torch.fft.rfft(t), torch.fft.rfft(x)
    torch.testing.assert_close(z.conj().imag.cpu(), ref.conj().imag)
    torch.testing.assert_close(z.conj()[1:].clone().cpu(), ref.conj()[1:].resolve_conj())
    torch.testing.assert_close(torch.view_as_real(z * 1).cpu(), torch.view_as_real(ref))


@pytest.mark.parametrize("mode", ["DEFER_NEVER", "DEFER_AND_FUSE"])
def test_complex_products_of_conjugate_views(mode: str, no_fallback: str) -> None:
    """mm/bmm/addmm/dot/vdot/solve_triangular reach the device with a view's conjugate bit set (CPU's BLAS
    reads it): the bit is resolved first, so `x.mH @ y` is the conjugate transpose's product."""
    g = torch.Generator().manual_seed(7)
    z, w = (torch.complex(torch.randn(3, 3, generator=g), torch.randn(3, 3, generator=g)) for _ in range(2))
    cases = (lambda a, b: a.mH @ b, lambda a, b: torch.bmm(a[None].conj(), b[None]),
             lambda a, b: torch.addmm(b, a.conj(), b, beta=2), lambda a, b: torch.dot(a[0].conj(), b[1]),
             lambda a, b: torch.vdot(a[0], b[1]), lambda a, b: torch.conj_physical(a.conj()),
             lambda a, b: torch.linalg.solve_triangular(a.triu().mH + 3 * torch.eye(3, device=a.device), b,
                                                        upper=False))
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode))
    try:
        for fn in cases:
            torch.testing.assert_close(fn(z.to(no_fallback), w.to(no_fallback)).cpu(), fn(z, w))
    finally:
        torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
