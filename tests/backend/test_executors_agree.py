"""Strict eager, Fused eager and `torch.compile(backend="tpu")` follow one op plan, so they must agree.

Each OpInfo sample (float32, seeded CPU samples copied to tpu) runs three ways; Fused and compiled results are
compared with Strict's at the OpInfo harness's tolerances, and where Strict raises, the other two must
raise too. CI runs the representative OpInfo slice plus hand-built cases for ops OpInfo does not reach
directly (max pooling with indices and its backward, layer norm, convolution, embedding, foreach ops,
in-place casts); the slow sweep (`make test-all`) runs every OpInfo of `op_db`, where a compiled graph may
refuse an op it cannot lower (graphs have no CPU fallback) but must never return another value.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.common_methods_invocations import op_db

from tests.backend import _opinfo
from tests.backend import _opinfo_tables as T

E = torch.tpu.EagerMode if hasattr(torch, "tpu") else None

NOT_COMPARABLE = {
    "empty_like": "uninitialized values",
    "rand_like": "random", "normal": "random", "bernoulli": "random", "nn.functional.dropout": "random",
    "masked_select": "data-dependent output shape (a graph break under torch.compile, not a value)",
}
"""Slice ops whose outputs cannot be compared across executors (the OpInfo sweep checks them on their own)."""

SLICE_SAMPLES, SWEEP_SAMPLES = 2, 1

KNOWN_DISAGREEMENTS = {
    "index_put": "compiled raises Unsupported for a boolean-mask index (data-dependent positions) where eager "
                 "runs it through the CPU fallback",
}
"""Slice ops whose executors disagree today, each with what happens. The test asserts they still disagree, so
fixing one fails the test until its entry is removed here."""


@contextlib.contextmanager
def _mode(mode):
    old = torch.tpu.eager_mode()
    torch.tpu.set_eager_mode(mode)
    try:
        yield
    finally:
        torch.tpu.set_eager_mode(old)


def _outcome(fn, *args, **kwargs):
    """("ok", CPU copy of the result) or ("error", first line of the exception)."""
    try:
        return "ok", _opinfo._to_cpu(fn(*args, **kwargs))
    except Exception as e:  # noqa: BLE001 - any error is an outcome to compare
        return "error", _opinfo.first_line(e)


def three_ways(fn, make_args):
    """fn(*args, **kwargs) under Strict, Fused and torch.compile; `make_args()` gives fresh tpu arguments."""
    out = {}
    with _mode(E.DEFER_NEVER):
        a, k = make_args()
        out["strict"] = _outcome(fn, *a, **k)
    with _mode(E.DEFER_AND_FUSE):
        a, k = make_args()
        out["fused"] = _outcome(lambda *x, **y: _materialized(fn(*x, **y)), *a, **k)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="tpu", dynamic=False)
    with _mode(E.DEFER_NEVER):
        a, k = make_args()
        out["compiled"] = _outcome(compiled, *a, **k)
    return out


def _materialized(x):
    from tputool.backend.fused import flush

    flush("test")
    return x


def assert_agree(out: dict, tol: dict, what: str, compiled_may_raise: bool = False) -> None:
    """Fused and compiled give Strict's values, or fail where Strict fails. `compiled_may_raise`: a compiled
    graph may refuse an op Strict runs (graphs have no CPU fallback), but never returns another value."""
    kind, ref = out["strict"]
    for name in ("fused", "compiled"):
        k, v = out[name]
        if name == "compiled" and compiled_may_raise and k == "error":
            continue
        if kind == "error":
            assert k == "error", f"{what}: Strict raises ({ref}) but {name} returns a value"
            continue
        assert k == "ok", f"{what}: {name} raises ({v}) where Strict returns a value"
        torch.testing.assert_close(v, ref, equal_nan=True, check_device=False, msg=lambda m, n=name: f"{what} "
                                   f"({n} vs strict): {m}", **tol)


def _ops(names=None):
    keys = {_opinfo.op_key(op): op for op in op_db}
    if names is not None:
        return [pytest.param(keys[n], id=n) for n in names if n not in NOT_COMPARABLE]
    skip = set(NOT_COMPARABLE) | set(T.SKIP_OPS) | T.DISTRIBUTION_OPS | set(T.SHAPE_ONLY_OPS)
    return [pytest.param(op, id=k, marks=pytest.mark.slow) for k, op in sorted(keys.items())
            if k not in skip and not any(k.startswith(p) for p in T.SKIP_PREFIXES)
            and torch.float32 in op.supported_dtypes("cpu")]


def _run_opinfo(op, max_samples: int, compiled_may_raise: bool = False) -> int:
    key = _opinfo.op_key(op)
    tol = _opinfo.tolerances(op, torch.float32, T.FORWARD_TOL)
    n = 0
    torch.manual_seed(0)
    for sample in op.sample_inputs("cpu", torch.float32, requires_grad=False):
        if n >= max_samples:
            break
        if _opinfo._random_sample(key, sample):
            continue
        n += 1

        def make(s=sample):
            moved = _opinfo._to_device((s.input, s.args, s.kwargs), "tpu", {})
            return (moved[0], *moved[1]), moved[2]

        def fn(*args, **kwargs):
            return _opinfo._values_only(op(*args, **kwargs)) if key in T.TIE_INDEX_OPS else op(*args, **kwargs)

        assert_agree(three_ways(fn, make), tol, f"{key} sample {n}", compiled_may_raise)
    return n


@pytest.mark.parametrize("op", _ops(T.CI_SLICE))
def test_slice_ops_agree(tpu_device, op):
    torch._dynamo.config.cache_size_limit = 64
    if _opinfo.op_key(op) in KNOWN_DISAGREEMENTS:
        with pytest.raises(AssertionError, match="compiled raises"):
            _run_opinfo(op, SLICE_SAMPLES)
        return
    assert _run_opinfo(op, SLICE_SAMPLES) >= 1


@pytest.mark.parametrize("op", _ops())
def test_every_opinfo_agrees(tpu_device, op):
    # Over all of op_db (2026-12-04: 636 OpInfos), Fused matches Strict everywhere and compiled graphs return
    # Strict's values wherever they compile; 165 OpInfos use an op a graph cannot lower (graphs have no CPU
    # fallback), so here compiled may raise, never differ.
    torch._dynamo.config.cache_size_limit = 64
    _run_opinfo(op, SWEEP_SAMPLES, compiled_may_raise=True)


def _tpu(*tensors, grad=False):
    return [t.detach().to("tpu").requires_grad_(grad) for t in tensors]


HAND = {
    "max_pool2d_with_indices": (lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), [(2, 3, 9, 9)]),
    "max_pool2d ceil_mode, dilation": (lambda x: F.max_pool2d(x, 2, 2, 0, 2, ceil_mode=True), [(1, 2, 11, 10)]),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (8,), w, b), [(4, 8), (8,), (8,)]),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), [(2, 3, 8, 8), (4, 3, 3, 3), (4,)]),
    "embedding": (lambda w: F.embedding(torch.tensor([[0, 2], [3, 1]], device="tpu"), w), [(5, 4)]),
    "foreach_add": (lambda a, b: torch._foreach_add([a, b], [b, a]), [(3, 4), (3, 4)]),
    "inplace int64 += float32": (lambda a: torch.zeros(3, dtype=torch.int64, device="tpu").add_(a), [(3,)]),
    "inplace float32 += int64": (lambda a: a.clone().add_(torch.ones(3, dtype=torch.int64, device="tpu")), [(3,)]),
    "inplace broadcast into smaller": (lambda a: torch.zeros(1, device="tpu").add_(a), [(3,)]),
}
"""Ops the OpInfo slice does not reach directly (or reaches through PyTorch's composites): fn, input shapes."""


@pytest.mark.parametrize("name", sorted(HAND))
def test_hand_built_cases_agree(tpu_device, name):
    fn, shapes = HAND[name]
    g = torch.Generator().manual_seed(0)
    cpu = [torch.randn(*s, generator=g) for s in shapes]
    assert_agree(three_ways(fn, lambda: (_tpu(*cpu), {})), T.FORWARD_TOL, name)


@pytest.mark.parametrize("name", ["max_pool2d_with_indices", "layer_norm", "conv2d", "embedding"])
def test_hand_built_gradients_agree(tpu_device, name):
    fn, shapes = HAND[name]
    g = torch.Generator().manual_seed(1)
    cpu = [torch.randn(*s, generator=g) for s in shapes]

    def grads(*xs):
        out = fn(*xs)
        out = out[0] if isinstance(out, tuple) else out
        return torch.autograd.grad(out.square().sum(), xs)

    assert_agree(three_ways(grads, lambda: (_tpu(*cpu, grad=True), {})), T.BACKWARD_TOL, f"{name} backward")
