"""Each fixture script has exactly one known problem: diagnose must find it at the marked line, and only it."""

from __future__ import annotations

import pytest

from tests.diagnose.conftest import FIXTURES, expected, tpu_works
from tputool.diagnose import diagnose
from tputool.rules.model import Severity

_COMPILED = pytest.mark.needs_compile
PROBLEM_FIXTURES = ["host_sync.py", "float64.py", pytest.param("graph_break.py", marks=_COMPILED),
                    pytest.param("recompile.py", marks=_COMPILED)]


def _problems(report) -> set[tuple[str, int]]:
    return {(f.name, f.line) for f in report.findings if f.severity >= Severity.WARNING}


@pytest.mark.parametrize("name", PROBLEM_FIXTURES)
def test_fixture_problem_found_at_marked_line(name, device):
    path = FIXTURES / name
    want = expected(path)
    assert want, f"{name} has no # expect: marker"
    report = diagnose(str(path), include_static=False)
    assert report.status == "ok", report.error
    assert (device in report.devices) and _problems(report) == want
    assert all(f.path == str(path) for f in report.findings if f.severity >= Severity.WARNING)


def test_clean_fixture_has_no_warning_or_error(device):
    report = diagnose(str(FIXTURES / "clean.py"))  # static analysis included: clean too
    assert report.status == "ok"
    assert report.steps == 4
    assert [f for f in report.findings if f.severity >= Severity.WARNING] == []


def test_float64_kept_on_the_host_is_no_tpu_problem(monkeypatch):
    """numpy's float64 data made float32 before it moves, and a float64 sum of the losses on the host: nothing of it
    is on the TPU (before: two TPU804 warnings, at from_numpy and at .double())."""
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "tpu")
    report = diagnose(str(FIXTURES / "clean_float64_host.py"))  # static analysis included: .cpu().double() is host
    assert report.status == "ok" and report.steps == 4
    assert [f for f in report.findings if f.severity >= Severity.WARNING] == []


def test_clean_inference_script_reading_once_after_the_loop_has_no_warning(device):
    """A line after the loop runs (and compiles) once: its late compiles are its warm-up, not TPU808."""
    report = diagnose(str(FIXTURES / "clean_infer.py"), include_static=False)
    assert report.status == "ok" and (report.loop, report.calls) == ("calls", 3)
    assert [f for f in report.findings if f.severity >= Severity.WARNING] == []


def test_clean_training_script_evaluating_after_the_loop_has_no_warning(monkeypatch):
    """A held-out set evaluated once after the loop compiles at a line the loop's periodic log also reaches: that is
    the set's warm-up after the last step (no TPU808), and its read is no step's (TPU809, not TPU601)."""
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "tpu")
    report = diagnose(str(FIXTURES / "clean_eval_after.py"), include_static=False)
    assert report.status == "ok" and report.steps == 12
    assert [f for f in report.findings if f.severity >= Severity.WARNING] == []
    assert [(f.code, f.line) for f in report.findings if f.code == "TPU809"] == [("TPU809", 20)]


def test_an_evaluation_mid_run_is_one_steps_new_programs_not_a_recompile(monkeypatch):
    """Two epochs, each ending in an evaluation of a held-out set of another size: the first one's programs compile
    in one step of the second half (at the line the training log compiles at too). That is a note (TPU808 at INFO,
    naming the step), not the warning a recompile in every step gets (timm's train.py over two epochs)."""
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "tpu")
    report = diagnose(str(FIXTURES / "clean_eval_mid.py"), include_static=False)
    assert report.status == "ok" and report.steps == 16
    assert [f for f in report.findings if f.severity >= Severity.WARNING] == []
    (f,) = [f for f in report.findings if f.code == "TPU808"]
    assert f.line == 19 and f.severity == Severity.INFO and "all in step 9" in f.message, f


def test_compiled_step_comparison_times_the_model_under_torch_compile(monkeypatch):
    """compare_compiled runs the script again with its top-level model compiled and reports the step times."""
    assert tpu_works(compile=True), "the bundled tpu device compile backend fails the probe script"
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "tpu")
    path = FIXTURES / "clean.py"
    report = diagnose(str(path), include_static=False, compare_compiled=True)
    (f,) = [f for f in report.findings if f.code == "TPU813"]
    assert (f.path, f.line) == (str(path), 12)  # the model's call in the loop
    assert f.extra["models"] == "Sequential" and f.extra["cost_basis"] == "measured"
    assert f.extra["eager_ms"] > 0 and f.extra["compiled_ms"] > 0 and f.extra["compared_steps"] == 4
    assert f.extra["cost_ms"] == pytest.approx(max(f.extra["eager_ms"] - f.extra["compiled_ms"], 0), abs=1e-3)


def test_unsupported_op_falls_back_to_cpu(monkeypatch):
    assert tpu_works(), "the bundled tpu device fails the probe script (CPU fallbacks only exist there)"
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "tpu")
    path = FIXTURES / "unsupported_op.py"
    report = diagnose(str(path), include_static=False)
    assert report.status == "ok", report.error
    assert expected(path) <= _problems(report)
    fb = [f for f in report.findings if f.code == "TPU803" and f.severity >= Severity.WARNING]
    assert fb and "double_it" in fb[0].message


@pytest.mark.parametrize("name, generate", [pytest.param("infer_shapes.py", False, marks=_COMPILED),
                                            ("generate_loop.py", True)])
def test_inference_loop_per_shape_compiles_found_at_the_call(name, generate, monkeypatch):
    assert tpu_works(compile=not generate), "the bundled tpu device fails the probe script"
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "tpu")
    path = FIXTURES / name
    report = diagnose(str(path), include_static=False)
    assert report.status == "ok", report.error
    assert (report.loop, report.steps) == ("calls", 0) and report.calls >= 6
    assert _problems(report) == expected(path)
    (f,) = [f for f in report.findings if f.extra.get("per_shape")]
    varying = {(v["input"], v["dim"]) for v in f.extra["varying"]}
    assert varying == ({("input_ids", 1)} if generate else {("input", 0)})
    assert ("static KV cache" in f.fix) == generate and "bucket" in f.fix
    tpu812 = [f for f in report.findings if f.code == "TPU812"]
    assert all("nothing needed" not in f.fix for f in tpu812)


def test_cache_grown_between_calls_is_named_as_the_cause_of_per_call_compiles(monkeypatch):
    assert tpu_works(), "the bundled tpu device fails the probe script"
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "tpu")
    path = FIXTURES / "cache_growth.py"
    report = diagnose(str(path), include_static=False)
    assert report.status == "ok", report.error
    assert _problems(report) == expected(path)
    (f,) = [f for f in report.findings if f.extra.get("per_shape")]
    assert f.extra["state"] and "aten.cat.default at" in f.message and "allocate it once" in f.fix
    fixed = FIXTURES / "static_cache.py"  # the advice followed: no recompile left, only the host read
    report = diagnose(str(fixed), include_static=False)
    assert report.status == "ok", report.error
    assert _problems(report) == expected(fixed) and not [f for f in report.findings if f.code == "TPU808"]


@pytest.mark.needs_compile
def test_inference_loop_over_fixed_buckets_is_warm_up(monkeypatch):
    assert tpu_works(compile=True), "the bundled tpu device compile backend fails the probe script"
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "tpu")
    report = diagnose(str(FIXTURES / "infer_buckets.py"), include_static=False)
    assert report.status == "ok" and report.loop == "calls" and report.calls == 8
    assert _problems(report) == set()
