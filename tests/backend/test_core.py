"""Core semantics of the bundled tpu backend, each checked against PyTorch on CPU."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import tputool.backend  # noqa: F401 - registers the device
from tputool.backend import events
from tputool.backend import tensor as tt

T = "tpu"


def same(a: torch.Tensor, b: torch.Tensor, **tol) -> None:
    assert a.device.type == T
    torch.testing.assert_close(a.cpu(), b, **tol)


def test_creation_and_round_trip():
    x = torch.ones(2, 3, device=T)
    assert x.device == torch.device("tpu:0") and x.shape == (2, 3) and x.dtype == torch.float32
    same(x, torch.ones(2, 3))
    c = torch.randn(4, 5)
    same(c.to(T), c)
    same(torch.zeros(3, dtype=torch.int64, device=T), torch.zeros(3, dtype=torch.int64))
    same(torch.full((2,), 7, device=T), torch.full((2,), 7))
    same(torch.arange(5, device=T), torch.arange(5))
    same(torch.arange(0, 1, 0.25, device=T), torch.arange(0, 1, 0.25))
    assert torch.tensor([1.5, 2.5], device=T).tolist() == [1.5, 2.5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                   torch.int32, torch.uint8, torch.bool])
def test_dtypes_round_trip_exactly(dtype):
    c = (torch.randn(17) * 100).to(dtype)
    x = c.to(T)
    assert x.dtype == dtype
    assert torch.equal(x.cpu(), c)


def test_int64_and_float64_keep_their_values():
    big = torch.tensor([2**40 + 1, -(2**50)], dtype=torch.int64)
    assert torch.equal((big.to(T) + 1).cpu(), big + 1)
    f = torch.tensor([1.0 + 1e-12], dtype=torch.float64)
    assert (f.to(T) - 1).item() == pytest.approx(1e-12, rel=1e-3)


def test_bfloat16_math_matches_cpu():
    a, b = torch.randn(8, 8, dtype=torch.bfloat16), torch.randn(8, 8, dtype=torch.bfloat16)
    same(a.to(T) + b.to(T), a + b)
    same(a.to(T) * 3, a * 3)
    same(a.to(T) @ b.to(T), a @ b, atol=5e-2, rtol=2e-2)
    same(a.to(T).sum(), a.sum(), atol=5e-2, rtol=1e-2)


def test_views_share_storage_and_in_place_updates_base():
    x = torch.zeros(3, 4, device=T)
    x[0].add_(1)
    x[:, 1] = 5
    x.t()[2].mul_(0)
    ref = torch.zeros(3, 4)
    ref[0].add_(1)
    ref[:, 1] = 5
    ref.t()[2].mul_(0)
    same(x, ref)
    v = x.view(12)
    v[3] = 9.0
    assert x[0, 3].item() == 9.0


@pytest.mark.parametrize("make", [
    lambda t: t.t(), lambda t: t[1], lambda t: t[:, 1:3], lambda t: t.transpose(0, 1)[::2],
    lambda t: t.unsqueeze(0).expand(2, 3, 4), lambda t: t.permute(1, 0), lambda t: t.diagonal(),
    lambda t: t.view(2, 6), lambda t: t.reshape(4, 3)[1:], lambda t: t.as_strided((2, 2), (1, 4), 1),
    lambda t: t.unfold(1, 2, 1), lambda t: t.narrow(0, 1, 2).select(1, 3),
])
def test_view_metadata_and_values_match_cpu(make):
    c = torch.arange(12.0).reshape(3, 4)
    x = c.to(T)
    vc, vx = make(c), make(x)
    assert vx.shape == vc.shape and vx.stride() == vc.stride() and vx.storage_offset() == vc.storage_offset()
    assert vx.untyped_storage()._cdata == x.untyped_storage()._cdata
    same(vx, vc)
    same(vx + 1, vc + 1)


def test_in_place_through_views_and_t_():
    c = torch.arange(6.0).reshape(2, 3)
    x = c.to(T)
    c.t_()
    x.t_()
    assert x.shape == c.shape and x.stride() == c.stride()
    c[1].add_(10)
    x[1].add_(10)
    same(x, c)
    cv, xv = c.view(-1) if c.is_contiguous() else c.reshape(-1), x.view(-1) if x.is_contiguous() else x.reshape(-1)
    same(xv, cv)


def test_out_and_resize_of_out():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    out = torch.empty(0, device=T)
    r = torch.add(a.to(T), b.to(T), out=out)
    assert r is out and out.shape == (3, 4)
    same(out, a + b)
    out2 = torch.empty(3, 4, dtype=torch.float64, device=T)
    torch.mul(a.to(T), 2, out=out2)
    assert out2.dtype == torch.float64
    same(out2, (a * 2).double())
    vals, idx = torch.empty(0, device=T), torch.empty(0, dtype=torch.long, device=T)
    torch.max(a.to(T), 1, out=(vals, idx))
    same(vals, a.max(1).values)
    same(idx, a.max(1).indices)


def test_in_place_cast_error_matches_cpu():
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(2, dtype=torch.long, device=T).add_(1.5)


@pytest.mark.parametrize("a,b", [
    (torch.tensor([1, 2], dtype=torch.int32), 2.5),
    (torch.tensor([1, 2], dtype=torch.int64), torch.tensor(3.0)),
    (torch.tensor([True, False]), 1),
    (torch.tensor([1.0], dtype=torch.bfloat16), torch.tensor([1.0], dtype=torch.float16)),
    (torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([1, 2], dtype=torch.int8)),
    (torch.tensor([1.0, 2.0]), torch.tensor(2, dtype=torch.int64)),
])
def test_type_promotion_matches_cpu(a, b):
    bt = b.to(T) if isinstance(b, torch.Tensor) else b
    for fn in (torch.add, torch.mul, torch.sub, torch.div, torch.eq):
        try:
            ref = fn(a, b)
        except RuntimeError:
            continue
        got = fn(a.to(T), bt)
        assert got.dtype == ref.dtype, fn
        same(got, ref)


def test_cpu_scalar_tensor_mixes_with_tpu():
    same(torch.ones(3, device=T) * torch.tensor(2.0), torch.ones(3) * 2)


def test_rng_reproducible_and_state_round_trip():
    torch.manual_seed(0)
    a = torch.rand(100, device=T).cpu()
    torch.manual_seed(0)
    b = torch.rand(100, device=T).cpu()
    assert torch.equal(a, b)
    c = torch.rand(100, device=T).cpu()
    assert not torch.equal(b, c)
    state = torch.tpu.get_rng_state()
    d = torch.randn(10, device=T).cpu()
    torch.tpu.set_rng_state(state)
    assert torch.equal(torch.randn(10, device=T).cpu(), d)
    before = torch.tpu.get_rng_state()
    with torch.random.fork_rng(device_type="tpu"):
        torch.rand(3, device=T)
    assert torch.equal(torch.tpu.get_rng_state(), before)
    assert 0.4 < a.mean().item() < 0.6


def test_random_distributions():
    torch.manual_seed(1)
    n = torch.randn(20000, device=T).cpu()
    assert abs(n.mean().item()) < 0.05 and abs(n.std().item() - 1) < 0.05
    d = torch.nn.functional.dropout(torch.ones(10000, device=T), 0.25).cpu()
    kept = d[d != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / 0.75)) and 0.2 < (d == 0).float().mean().item() < 0.3
    r = torch.randint(0, 5, (1000,), device=T).cpu()
    assert r.min().item() >= 0 and r.max().item() <= 4 and r.dtype == torch.int64


def test_fallback_warns_once_counts_and_can_be_forbidden(monkeypatch):
    from tputool.backend import fallback

    op = "aten._unique2.default"  # data-dependent output: no tpu lowering
    fallback._warned.discard(op)
    events.reset()
    x = torch.tensor([3.0, 1.0, 3.0, 2.0], device=T)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        r1 = torch.unique(x)
        r2, counts = torch.unique(x, return_counts=True)
    msgs = [m for m in w if op in str(m.message)]
    assert len(msgs) == 1 and "runs on CPU" in str(msgs[0].message)
    assert msgs[0].filename == __file__
    assert events.counts[("fallback", op)] == 2
    assert r1.device.type == T and r2.cpu().tolist() == [1.0, 2.0, 3.0] and counts.cpu().tolist() == [1, 1, 2]
    v, i = torch.kthvalue(x, 2)  # out= tensors written back through the fallback
    assert v.item() == 2.0 and i.item() == 3
    monkeypatch.setenv("TPUTOOL_FALLBACK", "error")
    with pytest.raises(NotImplementedError, match=op):
        torch.unique(x)


def test_events_recorded_for_sync_transfer_and_compile():
    events.reset()
    x = torch.randn(4, 4).to(T)
    assert events.total("transfer_h2d") >= 64
    y = x.cos().sin()  # a signature this test uses alone
    y.sum().item()
    assert events.counts[("host_sync", "item")] >= 1
    y.cpu()
    assert events.counts[("host_sync", "cpu")] >= 1 and events.total("transfer_d2h") >= 4
    assert events.total("compile") >= 1


def test_mlp_forward_backward_matches_cpu():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                            torch.nn.Linear(16, 4))
    mt = copy.deepcopy(m).to(T)
    x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
    loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward()
    lt = torch.nn.functional.cross_entropy(mt(x.to(T)), y.to(T))
    lt.backward()
    assert lt.item() == pytest.approx(loss.item(), rel=1e-5)
    for p, q in zip(m.parameters(), mt.parameters(), strict=True):
        same(q.grad, p.grad, atol=1e-5, rtol=1e-4)
    opt = torch.optim.AdamW(mt.parameters(), lr=1e-2)
    opt.step()
    opt_c = torch.optim.AdamW(m.parameters(), lr=1e-2)
    opt_c.step()
    for p, q in zip(m.parameters(), mt.parameters(), strict=True):
        same(q.detach(), p.detach(), atol=1e-5, rtol=1e-4)


def test_to_jax_from_jax_api():
    import jax.numpy as jnp

    x = torch.arange(6.0).reshape(2, 3).to(T)
    a = tt.to_jax(x.t())
    assert a.shape == (3, 2) and float(a[2, 1]) == 5.0
    t = tt.from_jax(jnp.ones((2, 2), jnp.bfloat16), requires_grad=True)
    assert t.device.type == T and t.dtype == torch.bfloat16 and t.requires_grad
    (t * 2).sum().backward()
    same(t.grad, torch.full((2, 2), 2.0, dtype=torch.bfloat16))


def test_tied_parameters_stay_tied_after_to_tpu():
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    m = torch.nn.ModuleDict({"emb": emb, "head": head}).to(T)
    assert m["head"].weight is m["emb"].weight and m["emb"].weight.device.type == T
    assert len(list(m.parameters())) == 1


def test_save_load_and_deepcopy():
    import io

    x = torch.arange(6.0).reshape(2, 3)
    buf = io.BytesIO()
    torch.save({"x": x.to(T), "row": x.to(T)[1], "n": torch.arange(3).to(T)}, buf)
    buf.seek(0)
    back = torch.load(buf)
    assert back["x"].device.type == T
    same(back["x"], x)
    same(back["row"], x[1])
    buf.seek(0)
    assert torch.load(buf, map_location="cpu")["n"].device.type == "cpu"
    cpu_buf = io.BytesIO()
    torch.save({"w": x, "h": x.bfloat16(), "b": x > 2}, cpu_buf)
    cpu_buf.seek(0)
    on_tpu = torch.load(cpu_buf, map_location="tpu")
    for k, ref in {"w": x, "h": x.bfloat16(), "b": x > 2}.items():
        assert on_tpu[k].dtype == ref.dtype
        same(on_tpu[k], ref)
    m = torch.nn.Linear(3, 2).to(T)
    m2 = copy.deepcopy(m)
    assert m2.weight.device.type == T and m2.weight is not m.weight
    same(m2.weight.detach(), m.weight.detach().cpu())
    t = x.to(T)
    c = copy.deepcopy(t)
    c.add_(1)
    assert t[0, 0].item() == 0.0 and c[0, 0].item() == 1.0


def test_dataloader_pin_memory_with_tpu_accelerator():
    from torch.utils.data import DataLoader, TensorDataset

    ds = TensorDataset(torch.randn(8, 3), torch.arange(8))
    batches = [(xb.to(T, non_blocking=True), yb.to(T)) for xb, yb in DataLoader(ds, batch_size=4, pin_memory=True)]
    assert len(batches) == 2 and batches[0][0].device.type == T
    same(batches[1][1], torch.arange(4, 8))


def test_shape_errors_are_runtime_errors_naming_the_op():
    x = torch.ones(2, 3, device=T)
    with pytest.raises(RuntimeError, match="aten.mm"):
        x @ x
