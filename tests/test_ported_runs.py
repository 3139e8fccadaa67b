"""Behaviour, not text: scripts written to the patterns of public CUDA repositories (our own code, in
fixtures/ported_runs/) are ported with the default, safe fixes and then run on tpu with the CPU reference's
results. A half-port (the device moved, the autocast device type not) would train in float32 and fail here."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tputool.cli import app

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ported_runs"


def _ported(tmp_path: Path, name: str) -> Path:
    shutil.copy(FIXTURES / name, tmp_path / name)
    res = CliRunner().invoke(app, ["port", str(tmp_path / name), "--write", "-q"])
    assert res.exit_code == 0, res.output
    return tmp_path / name


def _run(script: Path, *args: str) -> str:
    run = subprocess.run([sys.executable, script.name, *args], cwd=script.parent, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def _load_original(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py") + "_original", FIXTURES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ported_training_script_trains_under_bf16_autocast_with_cpus_losses(tmp_path):
    script = _ported(tmp_path, "tiny_gpt_train.py")
    code = script.read_text()
    assert "device_type = 'tpu' if 'tpu' in device else 'cpu'" in code  # the autocast device moved too
    assert "enabled=(dtype == 'float16')" in code  # the scaler still follows the user's dtype
    out = _run(script, "device=tpu", "dtype=bfloat16", "steps=4")
    assert out.count("logits torch.bfloat16") == 4, out  # autocast is on, as it was on CUDA
    tpu_losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", out)]

    ref = _load_original("tiny_gpt_train.py")
    ref.device, ref.dtype = "cpu", "bfloat16"
    torch.manual_seed(1337)
    cpu_losses = ref.train(ref.TinyGPT(), torch.autocast("cpu", dtype=torch.bfloat16), "cpu", 4)
    assert tpu_losses == pytest.approx(cpu_losses, rel=5e-3)


def test_ported_generate_with_compile_runs_on_tpu_with_cpus_tokens(tmp_path):
    script = _ported(tmp_path, "tiny_generate.py")
    code = script.read_text()
    assert 'mode="reduce-overhead", fullgraph=True, backend="tpu"' in code
    assert 'if "tpu" in device:\n        torch.tpu.synchronize(device)' in code
    compiled = _run(script, "--compile", "--max_new_tokens", "6")
    eager = _run(script, "--max_new_tokens", "6")
    ref = _run(FIXTURES / "tiny_generate.py", "--device", "cpu", "--max_new_tokens", "6")
    tokens = [re.search(r"tokens (\[.*\])", s).group(1) for s in (compiled, eager, ref)]
    assert tokens[0] == tokens[1] == tokens[2], tokens
