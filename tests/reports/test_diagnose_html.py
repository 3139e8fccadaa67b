"""`tputool diagnose --html`: the page on a hand-made report (time costs per finding, as the ranking by cost
writes them) and end to end on a script of our own; the checks made before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.reports.conftest import SCRIPTS, assert_self_contained, plots_of, table_rows, texts, tputool
from tputool.cli import app
from tputool.reports import diagnose as report
from tputool.reports.plots import short


def _finding(code, line, severity="warning", cost=None, basis="estimated", per_step=1.0, **extra):
    if cost is not None:
        extra.update(cost_ms=cost, cost_basis=basis)
    return {"severity": severity, "code": code, "name": code.lower(), "file": "train.py", "line": line,
            "message": f"{code} message", "fix": f"{code} fix", "count": 4, "per_step": per_step,
            "source": "runtime", "extra": extra}


DOC = {"schema": "tputool.diagnose/1", "script": "train.py", "status": "ok", "exit_code": 0, "steps": 8,
       "wall_s": 12.0, "run_s": 9.0, "step_s": 0.080, "loop": "steps", "calls": 0, "devices": ["tpu"],
       "verdict": "3 problems slow this script on TPU", "summary": {"error": 0, "warning": 3, "info": 1},
       "findings": [  # the report's order (by time cost), which the page must keep
           _finding("TPU802", 12, cost=30.0, basis="measured"),
           _finding("TPU803", 20, cost=2.5),
           _finding("TPU601", 31, cost=0.4),
           _finding("TPU603", 15, severity="info"),
           _finding("TPU812", 0, severity="info", compile_s=3.0, late_compile_s=1.2),
           {**_finding("TPU418", 7, severity="info"), "source": "static"}]}


def test_step_parts_come_from_the_findings_costs_and_the_rest_is_compute():
    parts = {p: (ms, basis) for p, ms, basis in report.step_parts(DOC)}
    assert parts["compiles"] == (30.0, "measured")  # the costed recompile, not TPU812's total again
    assert parts["fallbacks"] == (2.5, "estimated") and parts["host syncs"] == (0.4, "estimated")
    assert parts["transfers"] == (0.0, "none found")
    assert parts[report.COMPUTE][0] == pytest.approx(80.0 - 30.0 - 2.5 - 0.4)
    assert report.run_parts(DOC) == [("start-up and exit", 3.0), ("XLA compiles", 3.0),
                                     ("the script's own work", 6.0)]


def test_without_costs_steady_compiles_are_measured_and_other_parts_not_timed():
    doc = {**DOC, "findings": [{**f, "extra": {k: v for k, v in f["extra"].items() if not k.startswith("cost")}}
                               for f in DOC["findings"]]}
    parts = {p: (ms, basis) for p, ms, basis in report.step_parts(doc)}
    assert parts["compiles"] == (pytest.approx(1000 * 1.2 / 4), "measured")  # second-half seconds / 4 steps
    assert parts["fallbacks"] == (None, "not timed")
    assert parts[report.COMPUTE][0] == 0.0  # 300 ms of compiles per 80 ms step: nothing left, and the page says so
    assert "add up to 220 ms more than the measured step" in report.render(doc)


def test_page_plots_the_reports_numbers_in_the_reports_order():
    page = report.render(DOC)
    assert_self_contained(page)
    plots = plots_of(page)
    assert sorted(plots) == ["findings", "run", "step"]
    step = texts(plots["step"])
    for part, ms, _ in report.step_parts(DOC):
        assert part in step
        if ms:
            assert any(t.startswith(f"{short(ms)} ms ({ms / 80.0:.0%})") for t in step), (part, step)
    ranked = [t for t in texts(plots["findings"]) if t[:1].isdigit() and ". TPU" in t]
    assert ranked == ["1. TPU802 train.py:12", "2. TPU803 train.py:20", "3. TPU601 train.py:31",
                      "4. TPU603 train.py:15", "5. TPU812 train.py"]
    assert "30 ms/step, measured" in texts(plots["findings"])
    rows = table_rows(page, "findings")
    assert [r[2] for r in rows] == ["TPU802", "TPU803", "TPU601", "TPU603", "TPU812"]
    assert [r[1] for r in table_rows(page, "static")] == ["train.py:7"]
    run = texts(plots["run"])
    assert "3 s (25%)" in run and "6 s (50%)" in run


def test_static_only_report_has_no_time_plots():
    doc = {**DOC, "status": "static", "wall_s": None, "run_s": None, "step_s": None,
           "findings": [{**f, "source": "static"} for f in DOC["findings"][:2]]}
    page = report.render(doc)
    assert plots_of(page) == {} and "static analysis only" in page


def test_a_failed_run_shows_its_traceback():
    doc = {**DOC, "status": "error", "step_s": None, "error": {"type": "ValueError", "message": "bad shape",
           "traceback": [{"file": "train.py", "line": 40, "function": "<module>", "text": "model(x)"}]}}
    page = report.render(doc)
    assert table_rows(page, "traceback") == [["train.py:40", "<module>", "model(x)"]]
    assert "ValueError: bad shape" in page and "no steady-state step time" in page


def test_diagnose_html_end_to_end(tmp_path):
    out = tmp_path / "diagnose.html"
    r = tputool("diagnose", str(SCRIPTS / "slow_steps.py"), "--format", "json", "--html", str(out))
    assert r.returncode == 1, r.stderr  # the script has problems: diagnose's usual status
    doc = json.loads(r.stdout)
    page = out.read_text()
    assert_self_contained(page)
    plots = plots_of(page)
    assert sorted(plots) == ["findings", "run", "step"]
    assert f"Steady-state step: {short(1000 * doc['step_s'])} ms" in texts(plots["step"])
    ranked = report.ranked(doc)
    assert {"TPU601", "TPU803", "TPU807"} <= {f["code"] for f in ranked}
    assert [r[2] for r in table_rows(page, "findings")] == [f["code"] for f in ranked]
    assert not list(tmp_path.glob("*.tputool-tmp"))


def test_html_without_matplotlib_says_how_to_install_before_running(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # import matplotlib -> ImportError
    for args in (["diagnose", str(script)], ["parity", str(script)], ["tune", "--target", "v5e-8"]):
        res = CliRunner().invoke(app, [*args, "--html", str(tmp_path / "r.html")])
        assert res.exit_code == 2 or getattr(res.exception, "exit_code", None) == 2, res.output
        assert "pip install 'tputool[report]'" in str(res.exception)
    assert not marker.exists() and not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("where", ["missing/r.html", "."])
def test_html_path_is_checked_before_running(tmp_path, where):
    marker = tmp_path / "ran"
    script = tmp_path / "s.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    res = CliRunner().invoke(app, ["diagnose", str(script), "--html", str(tmp_path / where)])
    assert "--html" in str(res.exception) and res.exception.exit_code == 2
    assert not marker.exists()


def test_write_replaces_an_existing_page(tmp_path):
    from tputool.reports import write

    target = tmp_path / "r.html"
    target.write_text("old")
    write(str(target), "<p>new</p>")
    assert target.read_text() == "<p>new</p>" and [p.name for p in Path(tmp_path).iterdir()] == ["r.html"]
