"""Capture real traces of tiny jitted functions and read them back."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid

import pytest

from tputool.errors import UserError
from tputool.profile.categories import classify
from tputool.profile.reader import read_trace


def test_classify():
    assert classify("all-reduce") == "collective"
    assert classify("all-gather-start.1") == "collective"
    assert classify("reduce-scatter.3") == "collective"
    assert classify("collective-permute-done") == "collective"
    assert classify("fusion.all-to-all") == "collective"
    assert classify("ynn_fusion") == "compute"
    assert classify("dot.1") == "compute"
    assert classify("reduce.2") == "compute"


def test_capture_single_device(tmp_path):
    import jax
    import jax.numpy as jnp

    from tputool.profile.capture import capture

    salt = float(uuid.uuid4().int % 2**24)  # a computation no persistent cache (build/jax-cache) holds yet:
    # the first step must compile

    @jax.jit
    def f(x):
        return jnp.tanh(x @ x.T).sum() + salt

    x = jnp.ones((128, 128))
    s = capture(lambda i: f(x + i), steps=3, outdir=tmp_path)
    assert s.xplane_path.endswith(".xplane.pb")
    assert s.perfetto_path and s.perfetto_path.endswith("perfetto_trace.json.gz")
    # the first step compiles: reported as compile time, left out of step times
    assert s.compile_s > 0 and s.excluded_steps == 1 and len(s.step_times_s) == 2
    assert s.step_time_s > 0
    assert s.collective_s == 0 and s.compute_s > 0
    assert s.top_ops and all(op.category == "compute" for op in s.top_ops)
    assert abs(sum(op.fraction for op in s.top_ops) - 1) < 1e-6  # every op listed (few ops)


def test_capture_without_python_tracer_still_sees_steps_and_compiles(tmp_path):
    import jax
    import jax.numpy as jnp

    from tputool.profile.capture import capture

    salt = float(uuid.uuid4().int % 2**24)  # (see test_capture_single_device)
    f = jax.jit(lambda x: jnp.sin(x) @ x + salt)
    x = jnp.ones((64, 64))
    s = capture(lambda i: f(x), steps=3, outdir=tmp_path, python_tracer=False)
    assert s.excluded_steps == 1 and len(s.step_times_s) == 2 and s.compile_s > 0 and s.compute_s > 0


def test_missing_trace_is_user_error(tmp_path):
    with pytest.raises(UserError):
        read_trace(tmp_path)


SCRIPT = textwrap.dedent("""
    import os, json, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from tputool.profile.capture import capture
    mesh = Mesh(np.array(jax.devices()), ("d",))
    x = jax.device_put(jnp.ones((256, 128)), NamedSharding(mesh, P("d")))
    w = jnp.ones((128, 128))
    g = jax.jit(jax.grad(lambda w, x: jnp.tanh(x @ w).sum()))
    g(w, x).block_until_ready()
    s = capture(lambda i: g(w, x), steps=2, outdir=sys.argv[1])
    print(json.dumps(s.to_dict()))
""")


def test_capture_collectives_on_8_simulated_devices(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    s = json.loads(out.stdout.strip().splitlines()[-1])
    assert s["n_devices"] == 8
    assert s["compile_s"] == 0 and len(s["step_times_s"]) == 2
    assert s["collective_s"] > 0 and 0 < s["collective_fraction"] < 1
    assert any(op["category"] == "collective" and op["name"].startswith("all-reduce") for op in s["top_ops"])
    # the reader agrees with itself when the trace is read again from disk
    again = read_trace(tmp_path)
    assert again.collective_s == pytest.approx(s["collective_s"])
