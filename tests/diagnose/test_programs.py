"""`tputool diagnose` reports the figures a TPU run is judged by: XLA programs compiled before the first step
and device programs launched per steady step (text and JSON)."""

from __future__ import annotations

import json
import textwrap

import pytest
from typer.testing import CliRunner

from tests.diagnose.conftest import tpu_works
from tputool.cli import app

runner = CliRunner()
OPTIONS = ("--no-static", "--no-compare-compiled")

SCRIPT = """
import sys
import torch

device = sys.argv[1]
if device == "tpu":
    torch.tpu.set_eager_mode(getattr(torch.tpu.EagerMode, sys.argv[2]))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(8, 16, device=device), torch.randint(0, 4, (8,), device=device)
for step in range(6):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
print("final loss", loss.item())
"""


@pytest.fixture
def script(tmp_path, monkeypatch):
    monkeypatch.setenv("TPUTOOL_CACHE_DIR", str(tmp_path / "cache"))  # an empty persistent cache: cold compiles
    p = tmp_path / "train.py"
    p.write_text(textwrap.dedent(SCRIPT))
    return p


def _json(script, *args: str) -> dict:
    r = runner.invoke(app, ["diagnose", str(script), *OPTIONS, "--format", "json", "--", *args])
    assert r.exit_code in (0, 1), r.output  # (1: a warning about the run, which these tests do not judge)
    return json.loads(r.stdout)


def test_strict_and_fused_runs_report_compiles_before_the_first_step_and_launches_per_step(script):
    assert tpu_works(), "the bundled tpu device fails the probe script (run tests/backend to see why)"
    strict = _json(script, "tpu", "DEFER_NEVER")
    fused = _json(script, "tpu", "DEFER_AND_FUSE")
    assert strict["status"] == fused["status"] == "ok" and strict["steps"] == fused["steps"] == 6
    assert strict["launches_per_step"] >= 30  # one kernel per op: forward, backward and AdamW
    assert 1 <= fused["launches_per_step"] <= 10  # the step as a handful of fused programs
    assert strict["compiled_before_first_step"] > fused["compiled_before_first_step"] >= 1
    r = runner.invoke(app, ["diagnose", str(script), *OPTIONS, "--", "tpu", "DEFER_AND_FUSE"])
    assert r.exit_code in (0, 1), r.output
    line = next(ln for ln in r.output.splitlines() if ln.startswith("device programs:"))
    assert f"{fused['launches_per_step']} device program launch" in line and "per step in steady state" in line
    assert "compiled before the first step ended" in line


def test_cpu_run_reports_no_device_program_figures(script, monkeypatch):
    monkeypatch.setenv("TPUTOOL_BACKEND", "0")
    doc = _json(script, "cpu")
    assert doc["compiled_before_first_step"] is None and doc["launches_per_step"] is None
    r = runner.invoke(app, ["diagnose", str(script), *OPTIONS, "--", "cpu"])
    assert "device programs:" not in r.output
