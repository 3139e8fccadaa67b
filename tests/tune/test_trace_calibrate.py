"""`tune --calibrate`: a trace of a real run refits the cost model's fractions (round trip on this CPU)."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from tputool.cli import app
from tputool.profile.categories import op_class


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory):
    """A `tputool profile`-style trace of the tiny built-in llama's training step (one CPU device)."""
    from tputool.tune.api import profile_model
    from tputool.tune.candidate import Candidate

    out = tmp_path_factory.mktemp("trace")
    profile_model("llama", steps=4, outdir=out, candidate=Candidate(data=1, batch=2))
    return out


def test_op_classes():
    assert op_class("all-reduce.3") == "collective"
    assert op_class("dot.4") == op_class("convolution_add_fusion.2") == op_class("ynn_fusion.7") == "matmul"
    assert op_class("custom-call.splash_attention.1") == "attention"
    assert op_class("multiply_add_fusion.3") == op_class("fusion.12") == "elementwise"


def test_json_trace_reads_like_the_xplane(trace_dir):
    from tputool.profile.reader import read_json_trace, read_trace

    a, b = read_json_trace(trace_dir, top=10**9), read_trace(trace_dir, top=10**9)
    assert a.step_times_s == pytest.approx(b.step_times_s)
    assert a.compute_s == pytest.approx(b.compute_s) and len(a.top_ops) == len(b.top_ops)


def test_a_slow_step_moves_the_step_with_its_parts():
    """Op and idle times are means over the steps; the step the refit aims at is their mean too, so one slow
    step (a loaded host) cannot leave the parts summing to more than the step."""
    from tputool.profile.reader import OpStat, TraceSummary
    from tputool.tune.trace_calibrate import TraceTimes

    ops = [OpStat("dot.1", "m", "compute", 2e-3, 1, 0.5), OpStat("fusion.2", "m", "compute", 1e-3, 1, 0.5)]
    s = TraceSummary("t", "x", None, 1, [3.5e-3, 3.5e-3, 3.5e-3, 7.5e-3], 0.0, 3e-3, 0.0, 1.5e-3, 1e-3, ops)
    t = TraceTimes.from_summary(s)
    assert t.step == pytest.approx(t.idle + sum(t.by_class.values()))


def test_round_trip_refit_predicts_the_traced_step(trace_dir):
    from tputool.profile.reader import read_trace
    from tputool.tune.api import resolve_model
    from tputool.tune.calibrate import calibrate_host
    from tputool.tune.candidate import Candidate
    from tputool.tune.trace_calibrate import TraceTimes, calibrate

    times = TraceTimes.from_summary(read_trace(trace_dir, top=10**9))
    assert times.step > 0 and times.by_class["matmul"] > 0 and times.by_class["elementwise"] > 0
    dims = resolve_model("llama").dims
    import jax

    result = calibrate(dims, Candidate(data=1, batch=2), calibrate_host(jax.devices()[:1]), times)
    assert result.after.step_s == pytest.approx(times.step, rel=0.25)
    # the refit moved the model towards the trace
    assert abs(result.after.step_s / times.step - 1) <= abs(result.before.step_s / times.step - 1) + 1e-9
    text = "\n".join(result.lines())
    assert "the model predicted" in text and "refit fractions" in text


def test_cli_calibrate_writes_a_calibration_tune_reads(trace_dir, tmp_path, monkeypatch):
    monkeypatch.setattr("tputool.tune.tpu_compile.available", lambda: False)
    cal = tmp_path / "cal.yaml"
    res = CliRunner().invoke(app, ["tune", "--calibrate", str(trace_dir), "--model", "llama", "--target", "v5e-8",
                                   "--out", str(cal)])
    assert res.exit_code == 0, res.output
    assert "the trace shows" in res.output
    doc = yaml.safe_load(cal.read_text())
    assert set(doc["chips"]) == {"v5e"} and doc["chips"]["v5e"]["matmul"] > 0
    # plumbing: a search for v5e reads the refit fractions instead of the shipped ones
    outs = {}
    for name, extra in (("shipped", []), ("refit", ["--calibration", str(cal)])):
        outs[name] = tmp_path / f"{name}.yaml"
        r = CliRunner().invoke(app, ["tune", "--model", "llama", "--target", "v5e-8", "--batch", "1",
                                     "--mesh", "d8f1t1", "--remat", "none", "--attention", "plain",
                                     "--precision", "bf16", "--out", str(outs[name]), *extra])
        assert r.exit_code == 0, r.output
    steps = {k: yaml.safe_load(v.read_text())["predicted"]["step_s"] for k, v in outs.items()}
    assert steps["refit"] != pytest.approx(steps["shipped"], rel=0.05)
