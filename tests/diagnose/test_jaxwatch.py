"""JaxWatch: XLA compile seconds from jax.monitoring, tagged with the step they happened in."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tputool.diagnose.jaxwatch import JaxWatch


def test_compiles_are_timed_and_split_by_step():
    a, b, c = jnp.ones(3), jnp.ones(7), jnp.ones(2)
    step = [0]
    w = JaxWatch(lambda: step[0])
    assert w.install()
    try:
        jax.jit(lambda x: x * 3 + 1)(a).block_until_ready()  # step 0: warm-up
        step[0] = 3
        jax.jit(lambda x: x * 5 - 2)(b).block_until_ready()  # step 3: steady state of 4
    finally:
        w.remove()
    rec = w.to_record(4)
    assert rec["compiles"] == 2 and rec["late_compiles"] == 1
    assert rec["compile_s"] > 0 and 0 < rec["late_compile_s"] < rec["compile_s"]
    n = len(w.spans)
    jax.jit(lambda x: x - 9)(c).block_until_ready()
    assert len(w.spans) == n  # removed: no more events
