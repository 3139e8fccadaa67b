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


def test_bad_max_steps_is_a_user_error(tmp_path):
    p = _script(tmp_path, "pass\n")
    assert isinstance(runner.invoke(app, ["diagnose", str(p), "--max-steps", "0"]).exception, UserError)


def test_format_and_fail_on_are_choices(tmp_path):
    # Typer enums: a bad value is a usage error (exit status 2, nothing run) naming the choices.
    p = _script(tmp_path, "pass\n")
    for option, bad, choices in (("--format", "xml", "text, json"), ("--fail-on", "loud", "error, warning, info")):
        r = runner.invoke(app, ["diagnose", str(p), option, bad])
        assert r.exit_code == 2, r.output
        assert r.output == f"error: {option} must be one of {choices}, not '{bad}'\n"


def test_json_report_schema_and_host_sync(monkeypatch):
    monkeypatch.setenv("TPUTOOL_FIXTURE_DEVICE", "cpu")
    r = runner.invoke(app, ["diagnose", str(FIXTURES / "host_sync.py"), "--format", "json", "--no-static"])
    assert r.exit_code == 1, r.output  # a warning to act on (default --fail-on warning)
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


def test_nonzero_system_exit_is_passed_through_without_exception_advice(tmp_path):
    p = _script(tmp_path, "import sys\n\nsys.exit(3)\n")
    r = runner.invoke(app, ["diagnose", str(p), "--no-static", "--format", "json"])
    assert r.exit_code == 3
    doc = json.loads(r.stdout)
    assert (doc["exit_code"], doc["status"]) == (3, "exited")
    assert doc["verdict"].startswith("The script exited with status 3")
    (f,) = [f for f in doc["findings"] if f["code"] == "TPU810"]
    assert f["line"] == 3 and "exception" not in f["fix"] and "status 3" in f["message"]
    text = runner.invoke(app, ["diagnose", str(p), "--no-static"])
    assert text.exit_code == 3 and "exception" not in text.output


def test_segfault_exits_128_plus_signal_and_names_it(tmp_path):
    p = _script(tmp_path, "import os, signal\n\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    r = runner.invoke(app, ["diagnose", str(p), "--no-static", "--format", "json"])
    assert r.exit_code == 139
    doc = json.loads(r.stdout)
    assert (doc["status"], doc["signal"], doc["exit_code"]) == ("crashed", "SIGSEGV", 139)
    assert "SIGSEGV" in doc["verdict"] and "status -11" not in r.stdout


def test_keyboard_interrupt_exits_130(tmp_path):
    p = _script(tmp_path, "x = 1\nraise KeyboardInterrupt\n")
    r = runner.invoke(app, ["diagnose", str(p), "--no-static", "--format", "json"])
    assert r.exit_code == 130
    doc = json.loads(r.stdout)
    assert doc["status"] == "interrupted" and doc["verdict"].startswith("Interrupted at ")
    assert doc["stopped_at"]["line"] == 2


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
    assert r.exit_code == 124, r.output
    doc = json.loads(r.stdout)
    codes = {f["code"]: f for f in doc["findings"]}
    assert doc["status"] == "timeout" and "TPU811" in codes
    assert codes["TPU601"]["line"] == 6
    assert codes["TPU811"]["line"] in (6, 7) and doc["stopped_at"]["line"] == codes["TPU811"]["line"]
    assert ":0" not in doc["verdict"] and doc["verdict"].startswith("Stopped at --timeout at ")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie has ended
    except FileNotFoundError:
        return True


_SPAWNS = """\
    import pathlib
    import signal
    import subprocess
    import time

    {prelude}
    sleeper = subprocess.Popen(["sleep", "60"])
    pathlib.Path({pidfile!r}).write_text(str(sleeper.pid))
    while True:
        time.sleep(0.05)
    """


def test_processes_the_script_started_end_with_it_at_timeout(tmp_path):
    pidfile = tmp_path / "pid"
    p = _script(tmp_path, _SPAWNS.format(prelude="", pidfile=str(pidfile)))
    r = runner.invoke(app, ["diagnose", str(p), "--timeout", "3", "--no-static", "--format", "json"])
    assert r.exit_code == 124, r.output
    assert _gone(int(pidfile.read_text()))


def test_hard_kill_ends_the_whole_group(tmp_path, monkeypatch):
    from tputool.diagnose import diagnose
    from tputool.diagnose import runner as run_mod

    monkeypatch.setattr(run_mod, "HARD_KILL_GRACE_S", 1.0)
    pidfile = tmp_path / "pid"
    # The script ignores the soft timeout (SIGALRM) and SIGTERM: only the hard kill's SIGKILL ends it.
    prelude = "signal.signal(signal.SIGALRM, signal.SIG_IGN); signal.signal(signal.SIGTERM, signal.SIG_IGN)"
    p = _script(tmp_path, _SPAWNS.format(prelude=prelude, pidfile=str(pidfile)))
    report = diagnose(str(p), timeout_s=3, include_static=False)
    assert report.status == "timeout" and report.stopped_at is None
    assert _gone(int(pidfile.read_text()))


def test_syntax_error_points_at_the_line(tmp_path):
    p = _script(tmp_path, "x = 1\nif x\n    pass\n")
    r = runner.invoke(app, ["diagnose", str(p), "--no-static", "--format", "json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    (f,) = doc["findings"]
    assert (f["code"], f["line"]) == ("TPU810", 2) and f["message"].startswith("SyntaxError")


def test_ctrl_c_is_passed_to_the_script_and_ends_its_processes(tmp_path):
    import os
    import signal
    import time

    pidfile = tmp_path / "pid"
    p = _script(tmp_path, _SPAWNS.format(prelude="", pidfile=str(pidfile)))
    # Ctrl-C in a terminal reaches only diagnose's process group (the child has its own session).
    # (preexec: Ctrl-C handled as in a terminal even when pytest was started with SIGINT ignored, e.g. by `cmd &`)
    proc = subprocess.Popen([sys.executable, "-m", "tputool", "diagnose", str(p), "--no-static", "--format", "json"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    doc = json.loads(out)
    assert doc["status"] == "interrupted" and doc["stopped_at"]["file"].endswith("train.py")
    assert _gone(int(pidfile.read_text()))
