"""`tputool diagnose` through the CLI: exit codes, JSON schema, step limit, timeout, failing scripts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from tests.diagnose.conftest import FIXTURES
from tputool.cli import app
from tputool.errors import UserError

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("no_backend")


def _script(tmp_path, body: str):
    p = tmp_path / "train.py"
    p.write_text(textwrap.dedent(body))
    return p


def test_missing_script_is_a_one_line_error():
    r = runner.invoke(app, ["diagnose", "no/such/script.py"])
    assert isinstance(r.exception, UserError) and "no such script" in str(r.exception)
    proc = subprocess.run([sys.executable, "-m", "tputool", "diagnose", "no/such/script.py"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: no such script: no/such/script.py"


def test_bad_format_and_fail_on_are_user_errors(tmp_path):
    p = _script(tmp_path, "pass\n")
    for extra in (["--format", "xml"], ["--fail-on", "loud"], ["--max-steps", "0"]):
        assert isinstance(runner.invoke(app, ["diagnose", str(p), *extra]).exception, UserError)


def test_json_report_schema_and_host_sync(monkeypatch):
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "cpu")
    r = runner.invoke(app, ["diagnose", str(FIXTURES / "host_sync.py"), "--format", "json", "--no-static"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "tputool.diagnose/1"
    assert {"script", "status", "exit_code", "steps", "wall_s", "verdict", "summary", "findings", "error"} <= set(doc)
    assert doc["steps"] == 4 and doc["status"] == "ok"
    (f,) = [f for f in doc["findings"] if f["severity"] == "warning"]
    assert (f["code"], f["name"], f["line"], f["count"], f["per_step"]) == ("TPU601", "host-sync-in-loop", 16, 4, 1.0)
    assert f["fix"] and f["source"] == "runtime"


def test_fail_on_warning_exits_1(monkeypatch):
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "cpu")
    r = runner.invoke(app, ["diagnose", str(FIXTURES / "host_sync.py"), "--no-static", "--fail-on", "warning"])
    assert r.exit_code == 1
    assert "TPU601" in r.output


def test_failing_script_exit_1_with_user_traceback(tmp_path):
    p = _script(tmp_path, """\
        import torch

        def step(x):
            return x.view(3, 5)

        step(torch.ones(4))
        """)
    r = runner.invoke(app, ["diagnose", str(p), "--no-static"])
    assert r.exit_code == 1
    assert r.output.startswith("The script failed: RuntimeError")
    assert "train.py:6 in <module>" in r.output and "train.py:4 in step" in r.output
    assert "torch/" not in r.output.split("Traceback (your frames only):")[1]


def test_max_steps_stops_cleanly_and_script_args_pass_through(tmp_path):
    p = _script(tmp_path, """\
        import sys
        import torch

        n = int(sys.argv[1])
        w = torch.nn.Parameter(torch.ones(8))
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(n):
            w.sum().backward()
            opt.step()
        raise SystemExit("should not get here")
        """)
    r = runner.invoke(app, ["diagnose", str(p), "--max-steps", "3", "--format", "json", "--no-static", "--", "1000"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["status"], doc["steps"]) == ("step_limit", 3)


def test_nonzero_system_exit_is_a_failure(tmp_path):
    p = _script(tmp_path, "raise SystemExit(3)\n")
    r = runner.invoke(app, ["diagnose", str(p), "--no-static", "--format", "json"])
    assert r.exit_code == 1
    assert json.loads(r.stdout)["exit_code"] == 3


def test_timeout_still_reports(tmp_path):
    p = _script(tmp_path, """\
        import time
        import torch

        x = torch.ones(3)
        while True:
            x.sum().item()
            time.sleep(0.01)
        """)
    r = runner.invoke(app, ["diagnose", str(p), "--timeout", "1.5", "--no-static", "--format", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    codes = {f["code"]: f for f in doc["findings"]}
    assert doc["status"] == "timeout" and "TPU811" in codes
    assert codes["TPU601"]["line"] == 6


def test_syntax_error_points_at_the_line(tmp_path):
    p = _script(tmp_path, "x = 1\nif x\n    pass\n")
    r = runner.invoke(app, ["diagnose", str(p), "--no-static", "--format", "json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    (f,) = doc["findings"]
    assert (f["code"], f["line"]) == ("TPU810", 2) and f["message"].startswith("SyntaxError")
