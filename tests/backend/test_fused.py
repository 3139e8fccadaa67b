"""Fused eager mode (DEFER_AND_FUSE): same results as Strict, flushes at sync points, cached fused graphs."""

from __future__ import annotations

import copy

import pytest
import torch

from tputool.backend import events


@pytest.fixture
def fused(tpu_device: str):
    from tputool.backend import fused as engine

    events.reset()
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    yield engine
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)


def _flushes() -> dict[str, int]:
    return {d: n for (k, d), n in events.counts.items() if k == "flush"}


def test_ops_are_deferred_then_flushed_by_item_with_views_and_inplace(fused) -> None:
    x, w = torch.randn(4, 3), torch.randn(3, 2)
    y = (x.to("tpu") @ w.to("tpu")).relu() * 2 + 1
    y.add_(1)
    y[1:3].mul_(10)  # in-place through a view, deferred too
    assert isinstance(y.untyped_storage()._tpu, fused.Lazy) and len(fused.TRACE.nodes) > 3
    ref = (x @ w).relu() * 2 + 2
    ref[1:3] *= 10
    assert y.sum().item() == pytest.approx(ref.sum().item(), rel=1e-5)
    torch.testing.assert_close(y.cpu(), ref)
    assert any(".item()" in d for d in _flushes())  # .item() was the sync point


def test_a_copy_to_the_host_is_named_as_a_copy(fused) -> None:
    """`.cpu()` / `.tolist()` of a deferred result flush as a copy, not as the first part of `_to_copy`'s
    decomposition that needed data (`prims.convert_element_type ... (no lowering)`: read by diagnose as a gap)."""
    x = torch.arange(10).to("tpu") * 2
    assert x[-4:].tolist() == [12, 14, 16, 18]
    assert (x + 1).to(torch.float16).cpu()[1].item() == 3
    reasons = _flushes()
    assert reasons and all("copy to another device" in d for d in reasons), reasons


def test_training_matches_strict_and_steps_reuse_one_compiled_graph(fused, tpu_device: str) -> None:
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))

    def train(mode):
        torch.tpu.set_eager_mode(mode)
        m = copy.deepcopy(ref).to(tpu_device)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        losses = []
        for _ in range(4):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x.to(tpu_device)), y.to(tpu_device))
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        out = [float(v.cpu()) for v in losses]
        return out, {k: v.cpu() for k, v in m.state_dict().items()}

    strict_losses, strict_state = train(torch.tpu.EagerMode.DEFER_NEVER)
    events.reset()
    fused_losses, fused_state = train(torch.tpu.EagerMode.DEFER_AND_FUSE)
    torch.testing.assert_close(torch.tensor(fused_losses), torch.tensor(strict_losses), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused_state, strict_state, rtol=1e-5, atol=1e-6)
    assert _flushes().get("optimizer step") == 4
    assert events.counts[("compile", "fused graph")] <= 3  # step 1 (state init), then one graph reused


def test_leaving_fused_mode_flushes(fused, tpu_device: str) -> None:
    t = torch.ones(3, device=tpu_device) * 3
    assert isinstance(t.untyped_storage()._tpu, fused.Lazy)
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    assert not isinstance(t.untyped_storage()._tpu, fused.Lazy)
    assert _flushes().get("mode change") == 1
    torch.testing.assert_close(t.cpu(), torch.full((3,), 3.0))


def test_cnn_training_defers_conv_backward_with_masked_grads_and_matches_strict(fused, tpu_device: str) -> None:
    # bias-free conv on an input without grad: convolution_backward's output_mask leaves grad_input and
    # grad_bias out, so its lowering returns None for them (this used to abort the process in fused mode)
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4),
                              torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(64, 3))
    x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 3, (2,))

    def train(mode):
        torch.tpu.set_eager_mode(mode)
        m = copy.deepcopy(ref).to(tpu_device)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        losses = []
        for _ in range(3):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(m(x.to(tpu_device)), y.to(tpu_device))
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        return [float(v.cpu()) for v in losses], {k: v.cpu() for k, v in m.state_dict().items()}

    strict_losses, strict_state = train(torch.tpu.EagerMode.DEFER_NEVER)
    events.reset()
    fused_losses, fused_state = train(torch.tpu.EagerMode.DEFER_AND_FUSE)
    torch.testing.assert_close(torch.tensor(fused_losses), torch.tensor(strict_losses), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused_state, strict_state, rtol=1e-5, atol=1e-6)
    assert strict_losses[-1] < strict_losses[0]
    assert _flushes().get("optimizer step") == 3
    assert not [d for d in _flushes() if "could not defer" in d or "no lowering" in d]


def test_a_failed_recording_in_backward_runs_the_op_eagerly_instead_of_aborting(fused, tpu_device: str,
                                                                              monkeypatch) -> None:
    x = torch.randn(5)
    xt = x.to(tpu_device).requires_grad_(True)
    loss = (xt.sin() * 3).sum()
    record = fused._record

    def failing(func, facts, args, kwargs):
        if func is torch.ops.aten.mul.Tensor:  # the backward's grad * 3 and grad * cos(x), on a lazy grad
            raise ValueError("recording failed")
        return record(func, facts, args, kwargs)

    monkeypatch.setattr(fused, "_record", failing)
    loss.backward()  # runs on autograd's tpu worker thread
    torch.testing.assert_close(xt.grad.cpu(), 3 * x.cos())
    assert any("could not defer: ValueError: recording failed" in d for d in _flushes())


def test_rollback_forgets_nodes_and_restores_written_storages(fused, tpu_device: str) -> None:
    t = torch.ones(4, device=tpu_device) * 2
    before = t.untyped_storage()._tpu
    mark = fused.TRACE.mark()
    op = torch.ops.aten.mul_.Tensor
    fused._record(op, fused._facts(op), (t, torch.tensor(5.0)), {})  # a recording about to fail
    assert t.untyped_storage()._tpu is not before and len(fused.TRACE.nodes) > mark[0]
    fused.TRACE.rollback(mark)
    assert t.untyped_storage()._tpu is before and fused.TRACE.mark() == mark
    torch.testing.assert_close(t.cpu(), torch.full((4,), 2.0))


def test_only_values_still_held_become_outputs_of_the_flush(fused, tpu_device: str) -> None:
    """Intermediates (dead, or overwritten in place) are not kept alive by the trace's bookkeeping."""
    import gc

    x = torch.ones(4, device=tpu_device)
    fused.flush("test")
    a = x * 2
    a.add_(1)  # overwrites a's storage: the mul result is no longer held by anything
    b = a * 3
    del a
    gc.collect()
    live = [lz for r in fused.TRACE.lazies if (lz := r()) is not None and lz.value is None]
    assert len(live) == 1 and live[0] is b.untyped_storage()._tpu
    torch.testing.assert_close(b.cpu(), torch.full((4,), 9.0))


def test_inputs_only_the_trace_holds_are_donated(fused, tpu_device: str, monkeypatch) -> None:
    """A buffer overwritten in place is donated to the flush; one still held elsewhere is not."""
    import jax
    import jax.numpy as jnp

    ext = [jnp.ones(3), jnp.ones(3), 2.0]
    held = ext[1]
    assert fused._donatable(ext) == (0,) and held is ext[1]

    donated = []
    real_jit = jax.jit
    monkeypatch.setattr(jax, "jit", lambda f, **kw: donated.append(kw.get("donate_argnums")) or real_jit(f, **kw))
    p = torch.ones(1024, device=tpu_device)
    q = torch.ones(1024, device=tpu_device)
    fused.flush("test")
    p.add_(1)  # p's old buffer: held only by the trace now
    r = q * 3  # q's buffer is read and q stays alive
    fused.flush("test")
    assert donated[-1] == (0,)
    assert not q.untyped_storage()._tpu.is_deleted()
    torch.testing.assert_close(p.cpu(), torch.full((1024,), 2.0))
    torch.testing.assert_close(r.cpu(), torch.full((1024,), 3.0))
    torch.testing.assert_close(q.cpu(), torch.ones(1024))


def test_scalars_a_lowering_needs_static_are_recorded_static(fused, tpu_device: str) -> None:
    """pow's exponent stays a Python number in the fused graph (a traced exponent means the slow power)."""
    x = torch.rand(8, device=tpu_device)
    fused.flush("test")
    y = x.pow(2).add(x, alpha=1.5)
    kinds = [(n[2], n[4]) for n in fused.TRACE.nodes]
    assert ([("T",), ("s",)], {}) in kinds  # pow: tensor and a static exponent
    assert ([("T",), ("T",)], {"alpha": ("d",)}) in kinds  # add's alpha stays an input (no recompile per value)
    torch.testing.assert_close(y.cpu(), x.cpu() ** 2 + 1.5 * x.cpu())


def test_one_program_serves_every_value_of_a_number_argument(fused, tpu_device: str) -> None:
    """Python numbers and bools given where an op takes a Scalar are inputs of the fused computation, one per use:
    a loop's last step (`torch.full(size, done)` with done True) and a step whose numbers happen to be equal (small
    ints are one object) reuse the program of the others."""
    x = torch.arange(6.0, device=tpu_device)
    fused.flush("test")
    got = []
    for k in range(2, 6):
        flag = torch.full((6,), k == 5, dtype=torch.bool, device=tpu_device)  # True on the last step only
        y = x.add(x, alpha=k).masked_fill(flag, 2)  # on the first step alpha is the very object the 2 is
        got.append(y.cpu())
        if k == 2:
            compiled = events.counts[("compile", "fused graph")]
    assert events.counts[("compile", "fused graph")] == compiled  # (before: a new program on steps 1 and 4)
    xs = torch.arange(6.0)
    want = [torch.full((6,), 2.0) if k == 5 else xs + k * xs for k in range(2, 6)]
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("mode", ["DEFER_AND_FUSE", "DEFER_NEVER"])
def test_slicing_a_stored_tensor_at_a_new_offset_each_step_builds_no_new_program(fused, tpu_device: str, mode: str,
                                                                                  monkeypatch) -> None:
    """A batch read out of (and written into) a tensor kept on the device at a new offset every step, as
    word_language_model's `source[i:i + bptt]`: the offset is an input of the programs, not a constant (it
    compiled the whole step again for every batch), in Fused and Strict mode alike."""
    from tputool.diagnose.jaxwatch import JaxWatch

    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, mode))
    built = []  # (Fused: a program per new trace, whether compiled now or loaded from the disk cache)
    real = fused.Trace._compiled
    monkeypatch.setattr(fused.Trace, "_compiled", lambda self, *a: built.append(1) or real(self, *a))
    data = torch.arange(240.0).reshape(60, 4)
    src, out = data.to(tpu_device), torch.zeros(60, 4, device=tpu_device)
    w = ((torch.arange(12.0) - 6) / 4).reshape(4, 3).to(tpu_device)  # (quarters: every sum exact in any order)
    got, lowered = [], []
    for i in range(3, 50, 7):
        watch = JaxWatch(lambda: 0)
        watch.install()
        try:
            batch = src[i:i + 5]
            out[i:i + 5] = batch * 2  # (a write into the stored tensor at the same offset)
            got.append((batch @ w).sum(0).cpu())
        finally:
            watch.remove()
        lowered.append(sum(1 for _, name, _ in watch.spans if name == "lower_s") + len(built))
        built.clear()
    assert lowered[2:] == [0] * (len(lowered) - 2), lowered  # (before: new programs every step)
    want = [(data[i:i + 5] @ w.cpu()).sum(0) for i in range(3, 50, 7)]
    torch.testing.assert_close(got, want)
    expect = torch.zeros(60, 4)
    for i in range(3, 50, 7):
        expect[i:i + 5] = data[i:i + 5] * 2
    torch.testing.assert_close(out.cpu(), expect)


def test_a_python_number_given_for_a_tensor_argument_is_an_input(fused, tpu_device: str) -> None:
    """`total / count` with a Python count that grows every step (pytorch/examples imagenet's AverageMeter): the
    number is a wrapped number where the op takes a Tensor, an input of the fused computation as in Strict mode,
    so every step reuses one program (before: a new one per value, then the op ran alone each step). Its dtype
    rules stay a Python number's: an int tensor times a float is float32, a half tensor stays half."""
    x = torch.arange(6.0, device=tpu_device)
    n = torch.arange(6, dtype=torch.int32, device=tpu_device)
    h = torch.arange(6.0, dtype=torch.float16, device=tpu_device)
    fused.flush("test")
    got = []
    for count in range(8, 48, 8):
        got.append([t.cpu() for t in (x * 8 / count, n * (count / 3), n * count, h * (count + 0.5),
                                      torch.where(x > 2, x, count))])
        if count == 16:
            compiled = events.counts[("compile", "fused graph")]
    assert events.counts[("compile", "fused graph")] == compiled  # (before: a new program every step)
    xs, ns, hs = torch.arange(6.0), torch.arange(6, dtype=torch.int32), torch.arange(6.0, dtype=torch.float16)
    want = [[xs * 8 / c, ns * (c / 3), ns * c, hs * (c + 0.5), torch.where(xs > 2, xs, c)] for c in range(8, 48, 8)]
    for g, w in zip(got, want, strict=True):
        assert [t.dtype for t in g] == [t.dtype for t in w]
        torch.testing.assert_close(g, w)


def test_random_ops_and_tpu_factories_are_deferred_with_strict_modes_stream(tpu_device: str) -> None:
    """randn / randn_like / dropout and factories (full, ones, scalar_tensor) are recorded, not run eagerly,
    and a seed gives the same numbers in Fused mode as in Strict mode."""
    from tputool.backend import fused as engine

    x = torch.ones(64, device=tpu_device)

    def draw(mode):
        torch.manual_seed(0)
        events.reset()
        with torch.tpu.eager_mode(mode):
            vals = (torch.randn(8, device=tpu_device), torch.randn_like(x), torch.nn.functional.dropout(x, 0.5),
                    torch.ones(3, 3, dtype=torch.bool, device=tpu_device).tril(),
                    torch.scalar_tensor(2.5, device=tpu_device) * x[:2])
            if mode is torch.tpu.EagerMode.DEFER_AND_FUSE:
                assert len(engine.TRACE.nodes) >= 5 and not _flushes()  # all pending, nothing ran eagerly
            return [v.cpu() for v in vals]

    strict, fused_vals = draw(torch.tpu.EagerMode.DEFER_NEVER), draw(torch.tpu.EagerMode.DEFER_AND_FUSE)
    for s, f in zip(strict, fused_vals, strict=True):
        torch.testing.assert_close(f, s)


def test_cpu_sparse_tensors_pass_through_the_mode(fused) -> None:
    """Tensors without a storage (sparse) are not asked for one: CPU sparse ops run as usual."""
    s = torch.sparse_coo_tensor([[0, 1], [1, 0]], [1.0, 2.0], (2, 2))
    torch.testing.assert_close((s + s).to_dense(), torch.tensor([[0.0, 2.0], [4.0, 0.0]]))


def test_registering_a_lowering_forgets_the_ops_facts(fused, tpu_device: str) -> None:
    """An op's cached facts name its lowering: a lowering registered later must be seen."""
    from tputool.backend.lowerings import lowering

    x = torch.ones(3, device=tpu_device)
    (x + x).cpu()
    add = torch.ops.aten.add.Tensor
    facts = fused._FACTS[id(add)]
    lowering(add)(facts.low.fn)  # the same function again: a registration all the same
    assert id(add) not in fused._FACTS
    torch.testing.assert_close((x + x).cpu(), torch.full((3,), 2.0))


def test_cyclic_gc_pauses_while_a_trace_records_and_resumes_at_the_flush(fused, tpu_device: str) -> None:
    import gc

    x = torch.ones(4, device=tpu_device)  # (a tpu factory is recorded too)
    assert not gc.isenabled()
    fused.flush("test")
    assert gc.isenabled()
    y = x * 2 + 1
    assert fused.TRACE.nodes and not gc.isenabled()
    assert y.sum().item() == 12.0  # the flush
    assert gc.isenabled()
    gc.disable()  # a program that turned the collector off keeps it off
    try:
        (x * 3).sum().item()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failing_flush_resumes_the_cyclic_gc(fused, tpu_device: str, monkeypatch) -> None:
    import gc

    y = torch.ones(4, device=tpu_device) * 2
    assert not gc.isenabled()

    def broken(*args, **kwargs):
        raise RuntimeError("compile failed")

    monkeypatch.setattr(fused.cache, "call", broken)
    with pytest.raises(RuntimeError, match="compile failed"):
        fused.flush("test")
    assert gc.isenabled()
    monkeypatch.undo()
    fused.TRACE.reset()
    del y


def test_printing_a_pending_fused_tensor_shows_its_values():
    # Tensor printing disables dispatch modes, so the pending value must be forced before formatting.
    import torch

    from tputool.backend import runtime

    runtime.set_mode(runtime.EagerMode.DEFER_AND_FUSE)
    try:
        x = torch.ones(3, device="tpu") * 2
        y = x.view(3, 1)[1:] + 1
        assert repr(x) == "tensor([2., 2., 2.], device='tpu:0')"
        assert "[[3.],\n        [3.]]" in repr(y)
    finally:
        runtime.set_mode(runtime.EagerMode.DEFER_NEVER)


def test_copy_and_clone_of_conjugate_and_negative_views_resolve_the_bits(fused, tpu_device: str) -> None:
    """copy_/clone/mm see conjugate and negative views unresolved (PyTorch resolves them for other ops): Fused mode
    runs them as Strict does instead of recording a lowering that would read the raw values."""
    z = torch.complex(torch.randn(5), torch.randn(5))
    t = z.to(tpu_device) * 1  # (a pending value)
    out = torch.zeros(5, dtype=torch.complex64, device=tpu_device)
    out.copy_(t.conj())
    torch.testing.assert_close(out.cpu(), z.conj().resolve_conj())
    torch.testing.assert_close(t.conj().clone().resolve_conj().cpu(), z.conj().resolve_conj())
    m = torch.complex(torch.randn(3, 3), torch.randn(3, 3))
    tm = m.to(tpu_device) + 0
    torch.testing.assert_close((tm.conj() @ tm).cpu(), m.conj() @ m, rtol=1e-5, atol=1e-5)
    assert any("conjugate or negative view" in d for d in _flushes())


def test_factory_that_cannot_fit_raises_out_of_memory_at_its_call(fused, tpu_device: str) -> None:
    for make in (lambda: torch.zeros(1 << 40, device=tpu_device), lambda: torch.full((1 << 20, 1 << 20), 2.0,
                                                                                     device=tpu_device)):
        with pytest.raises(torch.OutOfMemoryError, match="tpu out of memory. Tried to allocate"):
            make()
    assert torch.ones(2, device=tpu_device).sum().item() == 2.0  # (the trace is still usable)


def test_torch_compile_under_fused_compiles_a_graph_fed_concrete_inputs(fused, tpu_device: str) -> None:
    """Fused's dispatch mode does not stop Dynamo: the frame is compiled, pending inputs are flushed first."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from tputool.backend.graph import install

    install()
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("tpu")
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh())
    ref_model = copy.deepcopy(model)
    model.to(tpu_device)
    x = torch.randn(2, 4)
    try:
        xt = x.to(tpu_device) * 2  # pending when the compiled graph is called
        assert isinstance(xt.untyped_storage()._tpu, fused.Lazy)
        out = torch.compile(model, backend=counter)(xt)
        out.sum().backward()
    finally:
        torch._dynamo.reset()
    ref = ref_model(x * 2)
    ref.sum().backward()
    assert counter.frame_count == 1 and counter.op_count > 0
    assert _flushes().get("compiled graph input", 0) >= 1  # (the forward's input; the backward's too)
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model[0].weight.grad.cpu(), ref_model[0].weight.grad, rtol=1e-5, atol=1e-6)


def test_svdvals_and_eigvalsh_run_on_the_device_and_keep_their_gradients(fused, tpu_device: str) -> None:
    """Under a dispatch mode ATen's composites ask for U/V and eigenvectors (CPU fallbacks); without a
    gradient to compute, Fused gets the values-only forms, as Strict does."""
    a = torch.randn(3, 5, 5)
    a = a @ a.mT + torch.eye(5)
    with torch.no_grad():
        s, w = torch.linalg.svdvals(a.to(tpu_device)), torch.linalg.eigvalsh(a.to(tpu_device), UPLO="U")
        assert isinstance(s.untyped_storage()._tpu, fused.Lazy)  # deferred, not run on the CPU
        torch.testing.assert_close(s.cpu(), torch.linalg.svdvals(a), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(w.cpu(), torch.linalg.eigvalsh(a, UPLO="U"), rtol=1e-4, atol=1e-4)
    assert not [d for (k, d), _ in events.counts.items() if k == "fallback"]
    x, ref = a.to(tpu_device).requires_grad_(), a.clone().requires_grad_()
    (torch.linalg.svdvals(x).sum() + torch.linalg.eigvalsh(x).sum()).backward()
    (torch.linalg.svdvals(ref).sum() + torch.linalg.eigvalsh(ref).sum()).backward()
    torch.testing.assert_close(x.grad.cpu(), ref.grad, rtol=1e-4, atol=1e-4)


def test_memory_allocated_counts_pending_values_when_recorded(fused, tpu_device: str) -> None:
    """As CUDA's allocator counts a tensor at its op: an `empty` tensor written in part, and a pending result,
    count once each, and nothing stays counted after they are dropped (the trace keeps no array for them)."""
    torch.tpu.synchronize()
    base = torch.tpu.memory_allocated()
    y = torch.empty(1 << 20, device=tpu_device)
    assert torch.tpu.memory_allocated() - base == 4 << 20
    y[: 1 << 19].fill_(1.0)  # a partial write of a never-written tensor: its zeros are part of the trace
    assert isinstance(y.untyped_storage()._tpu, fused.Lazy)
    x = torch.ones(1 << 18, device=tpu_device)  # 1 MiB, pending
    assert torch.tpu.memory_allocated() - base == 5 << 20
    del y, x
    assert torch.tpu.memory_allocated() == base
    z = torch.empty(6, dtype=torch.bfloat16, device=tpu_device)
    launches = events.total("launch")
    z[1:3].fill_(2.0)
    assert z.cpu()[1:3].tolist() == [2.0, 2.0] and z.dtype == torch.bfloat16
    assert events.total("launch") - launches == 1  # the flush at the read: no separate zeros kernel


def test_normal_from_numbers_draws_as_strict_and_refuses_integers_as_strict(fused, tpu_device: str) -> None:
    """`torch.normal(mean, std, size)` reaches Fused's mode whole: it draws Strict's values from the same seed,
    and an integer dtype fails with Strict's (and CUDA's) NotImplementedError, not a decomposition's check."""
    def draw() -> torch.Tensor:
        torch.tpu.manual_seed(5)
        return torch.normal(0.5, 2.0, (2, 3), device=tpu_device).cpu()

    got = draw()
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    want = draw()
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_AND_FUSE)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="normal_kernel"):
        torch.normal(0.0, 2.0, (2, 3), dtype=torch.int32, device=tpu_device)


def test_aot_autograd_and_make_fx_trace_under_fused(fused, tpu_device: str) -> None:
    """PyTorch's tracing modes run below Fused's: functionalized (AOTAutograd, opcheck) ops are passed on to
    their mode, and make_fx on real tpu tensors records every op (pending inputs computed first)."""
    from functorch.compile import nop
    from torch._functorch.aot_autograd import aot_function
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, y):
        return (x * y).sin().sum()

    x, y = torch.randn(3, requires_grad=True), torch.randn(3)
    out = aot_function(f, nop, dynamic=True)(x, y)
    out.backward()
    torch.testing.assert_close(out, f(x, y))
    torch.testing.assert_close(x.grad, y * (x * y).cos())
    xt, yt = x.detach().to(tpu_device) + 0, y.to(tpu_device)  # xt pending
    gm = make_fx(f)(xt, yt)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [
        torch.ops.aten.mul.Tensor, torch.ops.aten.sin.default, torch.ops.aten.sum.default]
    torch.testing.assert_close(gm(xt, yt).cpu(), f(x, y).detach())


def test_a_process_without_tpu_tensors_runs_its_cpu_ops_without_the_dispatch_mode() -> None:
    """Fused mode's dispatch mode sees every op, a CPU tensor's too (a Python call each): it is entered at the
    process's first tpu tensor, so code that never makes one (a script's CPU run, the CPU side of a benchmark)
    runs at PyTorch's own speed; from the first tpu tensor on, ops are recorded."""
    import os
    import subprocess
    import sys

    code = ("import torch\n"
            "from torch.utils._python_dispatch import _get_current_dispatch_mode_stack as modes\n"
            "import tputool.backend.fused as f\n"
            "from tputool.backend import runtime\n"
            "assert runtime.STATE.mode is runtime.EagerMode.DEFER_AND_FUSE\n"
            "x = torch.ones(4) + 1\n"
            "assert not modes(), modes()\n"
            "y = torch.ones(3, device='tpu') * 2 + 1\n"
            "assert [type(m).__name__ for m in modes()] == ['FuseMode'], modes()\n"
            "assert isinstance(y.untyped_storage()._tpu, f.Lazy)\n"
            "assert y.cpu().tolist() == [3.0, 3.0, 3.0]\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ},
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]


def test_shapes_known_to_the_recorder_equal_abstract_evaluation(fused, tpu_device: str, monkeypatch) -> None:
    """Reshapes, strided reads, writes through views and zeros of never-written storages are recorded with their
    shapes given (no abstract evaluation of a new trace): each given shape is what evaluating the node would say."""
    add = fused.Trace.add
    checked = []

    def add_checking(self, fn, fn_key, args, kinds, kwargs, kw_kinds, known=None, meta=None):
        if known is not None:
            desc = (fn_key, tuple(a[0] if k is fused.KIND_T else a for a, k in zip(args, kinds, strict=True)), ())
            want = self._shapes(fn, desc, args, kinds, kwargs, kw_kinds)
            assert (tuple(known[0]), known[1]) == (tuple(want.shape), want.dtype), fn_key
            checked.append(fn_key[0])
        return add(self, fn, fn_key, args, kinds, kwargs, kw_kinds, known, meta)

    monkeypatch.setattr(fused.Trace, "add", add_checking)
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    h = torch.randint(0, 9, (4, 6), dtype=torch.int16)
    t, i = x.to(tpu_device) * 1, h.to(tpu_device) + 0
    a = t.t() * 2  # a strided read
    b = t[1:3, ::2] + 1  # a read at an offset
    c = t.view(24) - 1  # a whole reshape, then a reshaped write below
    t[:, 1] = 7.0  # a write through a view
    i.t()[2:4].add_(3)  # an integer write through a transposed view
    e = torch.empty(3, 4, device=tpu_device)
    e[1] = 5.0  # a partial write into a never-written storage: zeros first
    flat = torch.empty(12, device=tpu_device)
    flat.view(3, 4).copy_(a[:3, :4])
    got = [v.cpu() for v in (a, b, c, t, i, e[1], flat)]
    ref_t = x.clone()
    ref_t[:, 1] = 7.0
    ref_i = h.clone()
    ref_i.t()[2:4].add_(3)
    want = [x.t() * 2, x[1:3, ::2] + 1, x.view(24) - 1, ref_t, ref_i, torch.full((4,), 5.0), (x.t() * 2)[:3, :4].reshape(12)]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert {"reshape", "read", "write", "zeros"} <= set(checked)


def test_new_op_nodes_take_their_shapes_from_meta_kernels_and_are_checked_when_traced(fused, tpu_device: str,
                                                                                     monkeypatch) -> None:
    """A new trace's op nodes get their shapes from PyTorch's meta kernels (no abstract evaluation); a lowering
    that may refuse its arguments is still evaluated; a recorded shape the traced value contradicts is an error
    at the flush, never a tensor whose data and metadata disagree."""
    evaluated = []
    shapes = fused.Trace._shapes
    monkeypatch.setattr(fused.Trace, "_shapes", lambda self, fn, desc, *rest: evaluated.append(desc[0]) or shapes(
        self, fn, desc, *rest))
    x = torch.randn(3, 7, 5).to(tpu_device)  # (a shape no other test uses: every node is new to the trie)
    y = (torch.softmax(x * 2, -1).sum(1, keepdim=True) > 0.1).to(torch.int32) + x.shape[0]
    assert y.shape == (3, 1, 5) and y.dtype == torch.int32
    torch.testing.assert_close(y.cpu(), (torch.softmax(x.cpu() * 2, -1).sum(1, keepdim=True) > 0.1).int() + 3)
    assert evaluated == []
    from tputool.backend.lowerings import LOWERINGS

    assert LOWERINGS[torch.ops.aten._linalg_svd.default].may_refuse  # (U and V are refused: only tracing tells)
    assert not LOWERINGS[torch.ops.aten.mul.Tensor].may_refuse

    real = fused._meta_shapes

    def wrong_dtype(f, args, kwargs):
        out = real(f, args, kwargs)
        return out if f.key != "aten.exp.default" else jax.ShapeDtypeStruct(out.shape, np.dtype("float16"))

    import jax
    import numpy as np

    monkeypatch.setattr(fused, "_meta_shapes", wrong_dtype)
    z = torch.randn(2, 9, 4).to(tpu_device).exp()
    assert z.dtype == torch.float16  # (what the wrong meta said)
    with pytest.raises(fused.ShapeMismatch, match="aten.exp.default computed"):
        z.cpu()
    with pytest.raises(RuntimeError, match="has no value"):  # (the trace is dropped: later work goes on)
        z.cpu()
    assert (torch.ones(2).to(tpu_device) + 1).cpu().tolist() == [2.0, 2.0]


def test_in_place_nodes_take_their_targets_shapes_and_keep_pytorchs_errors(fused, tpu_device: str,
                                                                           monkeypatch) -> None:
    """An in-place op new to the trie (an optimizer's foreach updates, `add_`) is checked by PyTorch's meta kernel
    and takes its targets' shapes and dtypes, without abstract evaluation; arguments the op refuses still raise
    PyTorch's error at the op, and the trace goes on."""
    evaluated = []
    shapes = fused.Trace._shapes
    monkeypatch.setattr(fused.Trace, "_shapes", lambda self, fn, desc, *rest: evaluated.append(desc[0]) or shapes(
        self, fn, desc, *rest))
    cpu = [torch.randn(3, 11, 2), torch.randn(13)]  # (shapes no other test uses: every node is new to the trie)
    ps = [t.to(tpu_device) for t in cpu]
    gs = [torch.randn_like(t) for t in cpu]
    tg = [g.to(tpu_device) for g in gs]
    evaluated.clear()
    torch._foreach_mul_(ps, 0.5)
    torch._foreach_addcdiv_(ps, tg, [g.abs() + 1 for g in tg], [0.1, 0.2])
    h = torch.arange(6.0, device=tpu_device).reshape(2, 3)
    h.add_(torch.ones(3, device=tpu_device), alpha=2)
    assert [e for e in evaluated if "foreach" in str(e) or "add_" in str(e)] == []
    k = torch.arange(4, device=tpu_device)
    k.mul_(3)  # (an integer target: its cast is checked by evaluating the lowering)
    assert [e[0] for e in evaluated] == ["aten.mul_.Tensor"] and k.cpu().tolist() == [0, 3, 6, 9]
    want = [t * 0.5 for t in cpu]
    torch._foreach_addcdiv_(want, gs, [g.abs() + 1 for g in gs], [0.1, 0.2])
    for p, w in zip(ps, want, strict=True):
        torch.testing.assert_close(p.cpu(), w)
    assert h.cpu().tolist() == [[2, 3, 4], [5, 6, 7]]
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        torch.ones(3, device=tpu_device).add_(torch.ones(2, 3, device=tpu_device))
    with pytest.raises(RuntimeError, match="can't be cast|not possible"):
        torch.ones(4, dtype=torch.int64, device=tpu_device).mul_(torch.rand(4, device=tpu_device))
    assert (torch.ones(2, device=tpu_device) * 3).cpu().tolist() == [3.0, 3.0]


def test_a_fused_computations_ops_are_named_after_the_recorded_ops(fused, tpu_device: str, monkeypatch) -> None:
    """Each recorded node's ops carry its name (the op's key, or read/write/reshape/zeros) in the fused
    computation's name stack, so a TPU profile of the step names PyTorch's ops, not `jit(run)/mul`."""
    import jax

    stacks: list[str] = []
    real = fused._runner

    def runner(nodes, outs, *rest, **kw):
        run = real(nodes, outs, *rest, **kw)

        def spy(*ext):
            avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) if hasattr(x, "shape") else x for x in ext]
            jaxpr = jax.make_jaxpr(run)(*avals)
            stacks.extend(str(e.source_info.name_stack) for e in jaxpr.jaxpr.eqns)
            return run(*ext)

        return spy

    monkeypatch.setattr(fused, "_runner", runner)
    x = torch.randn(3, 13, 4).to(tpu_device)  # (a shape no other test uses: a new trace)
    w = torch.randn(4, 5).to(tpu_device)
    y = torch.relu(x @ w).transpose(0, 2)  # (mm on a reshape, a strided read for the transposed result)
    y[0] += 1.0  # (a write through a view)
    got = y.cpu()
    want = torch.relu(x.cpu() @ w.cpu()).transpose(0, 2)
    want[0] += 1.0
    torch.testing.assert_close(got, want)
    named = " ".join(stacks)
    for name in ("aten.relu.default", "aten.add_.Tensor", "write"):
        assert name in named, (name, sorted(set(stacks)))
    assert all(s for s in stacks), "an op of the fused computation has no name"


@pytest.mark.parametrize("sync_first", [False, True], ids=["sync-after-cat", "cat-starts-the-trace"])
def test_a_sequence_growing_by_a_token_each_step_stops_compiling_the_whole_step(fused, tpu_device: str,
                                                                                  monkeypatch, sync_first) -> None:
    """A decoding loop of its own (minGPT's kind): the sequence grows by one token per step, the model reads its
    last BLOCK tokens. Once the read of the tail and the concatenation have had several lengths at their places,
    they run alone and the model's step is the fused program compiled before; every token equals CPU's. With the
    loop's sync before the concatenation (as after a sampling op run on the CPU), the growing op starts each trace
    (ROOT_WINDOW). While the whole step is new per length (before the block), running ops alone is given up
    after two tries and tried again later (CHURN_RETRY_MAX)."""
    import torch.nn.functional as F

    nodes = []
    real = fused.Trace._compiled
    monkeypatch.setattr(fused.Trace, "_compiled", lambda self, *a: nodes.append(len(self.nodes)) or real(self, *a))
    vocab, block = 17, 8
    torch.manual_seed(0)
    emb, pos, head = torch.nn.Embedding(vocab, 16), torch.nn.Embedding(block, 16), torch.nn.Linear(16, vocab)

    def generate(idx: torch.Tensor, n: int) -> tuple[torch.Tensor, list[int]]:
        per_token = []
        for _ in range(n):
            before = len(nodes)
            cond = idx if idx.size(1) <= block else idx[:, -block:]
            where = torch.arange(cond.size(1), device=cond.device)  # (first, as minGPT's and nanoGPT's models do)
            h = emb(cond) + pos(where)
            nxt = torch.argmax(F.softmax(head(torch.tanh(h))[:, -1, :], dim=-1), dim=-1, keepdim=True)
            if sync_first:
                int(nxt[0, 0])
            idx = torch.cat((idx, nxt), dim=1)
            if not sync_first:
                int(nxt[0, 0])  # the loop's own sync (a stopping check)
            per_token.append(sum(nodes[before:]))
        return idx, per_token

    x = torch.randint(0, vocab, (1, 3), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, _ = generate(x, 64)
        for m in (emb, pos, head):
            m.to(tpu_device)
        got, per_token = generate(x.to(tpu_device), 64)
    assert torch.equal(got.cpu(), want)
    assert max(per_token[:5]) > 5  # (the step is a fused program: compiled while the shapes are new)
    assert per_token[-8:] == [0] * 8, per_token  # past the block: nothing of the step compiles again
    if not sync_first:  # (the prefix before the concatenation is flushed, named; with nothing before it, none is)
        assert any("keep changing here" in d for d in _flushes())


def test_a_random_op_run_alone_draws_what_it_would_have_drawn_recorded(fused, tpu_device: str) -> None:
    """A random op whose shapes keep changing at the start of each trace runs alone (from the third length on):
    the draw its recording took is given back first, so a seeded stream gives the same numbers as in Strict mode
    (else it skips a key every time the op runs alone)."""
    g = torch.Generator(device=tpu_device)

    def draws() -> list[torch.Tensor]:
        out = []
        for n in range(31, 39):  # (lengths no other test uses: each a new trace)
            g.manual_seed(5)
            torch.tpu.manual_seed(5)
            out.append(torch.cat([torch.randn(n, device=tpu_device, generator=g),
                                  torch.rand(n, device=tpu_device)]).cpu())  # (.cpu(): the trace ends here)
        return out

    got = draws()
    torch.tpu.set_eager_mode(torch.tpu.EagerMode.DEFER_NEVER)
    want = draws()
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
