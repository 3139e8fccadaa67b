"""JaxWatch: XLA compile seconds from jax.monitoring, tagged with the step they happened in."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tputool.diagnose.jaxwatch import JaxWatch, late_compile_steps


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


def test_late_compiles_skip_two_warm_up_steps_and_the_runs_tail():
    """Late (steady-state) compiles: the second half of the run, never the first two iterations (the optimizer's
    state is built in the first, the second is the first with it) nor after the last one ended."""
    assert [list(late_compile_steps(n)) for n in (0, 1, 2, 3, 4, 9)] == [[], [], [], [2], [2, 3], [4, 5, 6, 7, 8]]
    w = JaxWatch(lambda: 0)
    w.spans = [(1, "compile_s", 1.0), (2, "compile_s", 2.0), (3, "compile_s", 4.0), (4, "compile_s", 8.0)]
    rec = w.to_record(4)  # iterations 0-3 ran; 4 is after the last one (a final evaluation)
    assert (rec["compiles"], rec["late_compiles"], rec["late_compile_s"]) == (4, 2, 6.0)
    assert w.to_record(2)["late_compiles"] == 0  # a two-step run: its compiles are warm-up
