"""`tputool profile SCRIPT`: runs the script under the profilers and prints the summary and trace paths."""

from __future__ import annotations

import textwrap

from typer.testing import CliRunner

from tputool.cli import app
from tputool.errors import UserError

runner = CliRunner()


def test_profile_script(tmp_path):
    script = tmp_path / "work.py"
    script.write_text(textwrap.dedent("""
        import jax, jax.numpy as jnp
        f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
        x = jnp.ones((96, 96))
        for _ in range(3):
            f(x).block_until_ready()
    """))
    out = tmp_path / "trace"
    res = runner.invoke(app, ["profile", str(script), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "step summary" in res.output and "top XLA ops" in res.output
    assert "Perfetto" in res.output and "tensorboard --logdir" in res.output
    assert (out / "torch_trace.json").is_file()
    assert list(out.rglob("*.xplane.pb"))


def test_profile_needs_exactly_one_target(tmp_path):
    res = runner.invoke(app, ["profile"])
    assert isinstance(res.exception, UserError)
    res = runner.invoke(app, ["profile", str(tmp_path / "missing.py")])
    assert isinstance(res.exception, UserError) and "script not found" in str(res.exception)
