"""FX -> JAX interpreter (`tputool.backend.graph.jaxify`) on CPU tensors, with small explicit lowering tables.

These check the interpreter itself (placeholders, constants, getitem, sizes as static arguments, RNG keys,
compile counting, missing-op errors) independently of the backend's full lowering table.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tputool.backend import events
from tputool.backend.graph.jaxify import MissingLoweringError, jaxify, missing_lowerings
from tputool.backend.lowerings import Lowering
from tputool.backend.tensor import cpu_to_jax as _cpu_to_jax
from tputool.backend.tensor import jax_to_cpu as _jax_to_cpu

aten = torch.ops.aten

TABLE = {
    aten.mm.default: Lowering(lambda a, b: a @ b),
    aten.add.Tensor: Lowering(lambda a, b, alpha=1: a + alpha * b),
    aten.mul.Tensor: Lowering(lambda a, b: a * b),
    aten.relu.default: Lowering(lambda a: jnp.maximum(a, 0)),
    aten.var_mean.correction: Lowering(
        lambda a, dim=None, correction=1, keepdim=False: (
            jnp.var(a, axis=tuple(dim), ddof=correction, keepdims=keepdim),
            jnp.mean(a, axis=tuple(dim), keepdims=keepdim),
        )
    ),
    aten.view.default: Lowering(lambda a, shape: jnp.reshape(a, shape)),
    aten.rand.default: Lowering(
        lambda size, dtype=None, layout=None, device=None, pin_memory=None, rng_key=None: jax.random.uniform(
            rng_key, size
        ),
        needs_rng=True,
    ),
}


def cpu_to_jax(t):
    return _cpu_to_jax(t, count=False)


def jax_to_cpu(a):
    return _jax_to_cpu(a, count=False)


def _run(gm, *tensors, **kw):
    g = jaxify(gm, table=TABLE, **kw)
    return g, [jax_to_cpu(o) for o in g(*[cpu_to_jax(t) for t in tensors])]


def test_matches_torch_and_reads_constants() -> None:
    w = torch.randn(4, 4)

    def f(x):
        return torch.relu(x @ w + x)

    x = torch.randn(3, 4)
    gm = make_fx(f)(x)
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    _, (out,) = _run(gm, x)
    torch.testing.assert_close(out, f(x))


def test_tuple_results_through_getitem() -> None:
    def f(x):
        v, m = torch.var_mean(x, dim=[1], correction=1)
        return v, m * 2

    x = torch.randn(5, 6)
    _, (v, m2) = _run(make_fx(f)(x), x)
    rv, rm = torch.var_mean(x, dim=[1], correction=1)
    torch.testing.assert_close(v, rv)
    torch.testing.assert_close(m2, rm * 2)


def test_missing_lowering_names_every_op() -> None:
    gm = make_fx(lambda x: x.sin().cos() + x)(torch.randn(2))
    assert missing_lowerings(gm, TABLE) == ["aten.sin.default", "aten.cos.default"]
    with pytest.raises(MissingLoweringError, match="aten.sin.default, aten.cos.default"):
        jaxify(gm, table=TABLE, name="g")


def test_sizes_are_static_arguments_and_each_signature_compiles_once() -> None:
    def f(x, n):
        return x.view(n, -1) * 2

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(4, 6), 2)
    events.reset()
    g = jaxify(gm, [torch.randn(4, 6), 2], table=TABLE, name="sym")
    assert g.static_positions == (1,)
    for n in (2, 3, 2):
        (out,) = g(cpu_to_jax(torch.ones(4, 6)), n)
        assert out.shape == (n, 24 // n)
    assert events.counts[("compile", "sym")] == 2
    assert events.counts[("recompile", "sym: new input signature")] == 1


def test_random_ops_take_the_callers_key() -> None:
    gm = make_fx(lambda x: x + torch.rand(3))(torch.zeros(3))
    g = jaxify(gm, table=TABLE)
    assert g.uses_rng
    x = cpu_to_jax(torch.zeros(3))
    a = g(x, rng_key=jax.random.key(0))[0]
    b = g(x, rng_key=jax.random.key(0))[0]
    c = g(x, rng_key=jax.random.key(1))[0]
    assert bool(jnp.all(a == b)) and not bool(jnp.all(a == c))
    assert bool(jnp.all((a >= 0) & (a < 1)))


def test_kept_input_mutations_come_back_and_can_be_donated() -> None:
    def f(x, acc):
        acc.add_(x)
        return x * 2

    from torch.func import functionalize

    x, acc = torch.ones(3), torch.zeros(3)
    gm = make_fx(functionalize(f, remove="mutations_and_views"))(x.clone(), acc.clone())  # ends in copy_
    g = jaxify(gm, table=TABLE)
    assert g.mutated == (1,)
    ja, jacc = cpu_to_jax(x), cpu_to_jax(acc)
    out, new_acc = g(ja, jacc, donate=True)
    assert jacc.is_deleted() and not ja.is_deleted() and g.donated_calls == 1
    torch.testing.assert_close(jax_to_cpu(out), torch.full((3,), 2.0))
    torch.testing.assert_close(jax_to_cpu(new_acc), torch.ones(3))
