"""Issue 32: every bad input is one `error:` line with a documented status, and a failed run changes nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tputool.cli import app
from tputool.codemods import writer

SOURCE = "import torch\nx = torch.zeros(3).cuda()\n"


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tputool", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def _one_line_usage_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return lines[0]


@pytest.mark.parametrize("command", ["diagnose", "parity", "run"])
def test_missing_script_argument_is_a_usage_error(command):
    assert _one_line_usage_error(_cli(command)) == "error: missing argument SCRIPT"


@pytest.mark.parametrize("args", [
    ["tune", "--steps", "0"], ["tune", "--cpu-devices", "0"], ["tune", "--show", "-1"], ["tune", "--hbm-gb", "-3"],
    ["tune", "--fraction", "1.5"], ["tune", "--global-batch", "0"], ["tune", "--max-tensor", "0"],
    ["port", "-j", "-3", "."], ["check", "-j", "-1", "."], ["run", "--nproc", "0", "x.py"],
    ["run", "--master-port", "70000", "x.py"], ["profile", "--steps", "0"],
])
def test_numeric_options_are_range_checked_up_front(args):
    line = _one_line_usage_error(_cli(*args))
    assert line.startswith("error: invalid value for --")


@pytest.mark.parametrize(("override", "says"), [
    ("dim=abc", "dim must be a positive integer, got 'abc'"),
    ("n_layers=-2", "n_layers must be a positive integer, got -2"),
    ("n_layers=0", "n_layers must be a positive integer, got 0"),
    ("norm_eps=0", "norm_eps must be a positive number"),
    ("tie_embeddings=1", "tie_embeddings must be True or False"),
    ("n_heads=3", "dim (64) must divide by n_heads (3)"),
])
def test_model_overrides_are_checked_against_the_config(override, says):
    line = _one_line_usage_error(_cli("tune", "--target", "v5e-8", "--set", override))
    assert says in line


def test_moe_and_vit_overrides_checked_for_meaning():
    from tputool.errors import UserError
    from tputool.models import MODELS

    with pytest.raises(UserError, match="top_k must be in"):
        MODELS["moe"].config(top_k=5)
    with pytest.raises(UserError, match="image_size .* must divide by patch_size"):
        MODELS["vit"].config(patch_size=5)
    with pytest.raises(UserError, match="positive integers"):
        MODELS["cnn"].config(channels=(16, 0))
    assert MODELS["llama"].config(dim=128, n_heads=8, n_kv_heads=4).dim == 128


def test_report_that_cannot_be_written_changes_no_file(tmp_path):
    src = tmp_path / "x.py"
    src.write_text(SOURCE)
    proc = _cli("port", str(src), "--write", "--report", "/dev/full")
    _one_line_usage_error(proc)
    assert src.read_bytes() == SOURCE.encode()


def test_report_staging_failure_changes_no_file(tmp_path, monkeypatch):
    src = tmp_path / "x.py"
    src.write_text(SOURCE)

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.fsync", full)
    r = CliRunner().invoke(app, ["port", str(src), "--write", "--report", str(tmp_path / "r.json")])
    assert r.exit_code == 2 and "no file written" in r.output
    assert src.read_bytes() == SOURCE.encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.py"]


def test_report_failing_after_writes_says_what_was_written(tmp_path, monkeypatch):
    src = tmp_path / "x.py"
    src.write_text(SOURCE)
    real = __import__("os").replace

    def replace(a, b):
        if str(b).endswith("r.json"):
            raise OSError(28, "No space left on device")
        return real(a, b)

    monkeypatch.setattr("os.replace", replace)
    r = CliRunner().invoke(app, ["port", str(src), "--write", "-q", "--report", str(tmp_path / "r.json")])
    assert r.exit_code == 2 and "1 file(s) were written" in r.output and "x.py" in r.output
    assert src.read_text() != SOURCE


def test_interrupt_counts_the_file_whose_write_landed(tmp_path, monkeypatch):
    for i in range(5):
        (tmp_path / f"m{i}.py").write_text(SOURCE)
    real, calls = writer.write_atomic, []

    def write_then_interrupt(path, data):
        real(path, data)
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(writer, "write_atomic", write_then_interrupt)
    r = CliRunner().invoke(app, ["port", str(tmp_path), "--write", "-j", "1"])
    assert r.exit_code == 130
    assert "3 file(s) already written" in r.output
    listed = [line.strip() for line in r.output.splitlines() if line.startswith("  ")]
    assert len(listed) == 3 and all(name.endswith(".py") for name in listed)


def test_read_only_file_is_not_reported_fixed(tmp_path):
    ro, rw = tmp_path / "ro.py", tmp_path / "rw.py"
    ro.write_text(SOURCE)
    rw.write_text(SOURCE)
    ro.chmod(0o444)
    from tputool.codemods import engine
    from tputool.codemods.config import ProjectConfig

    result = engine.run([str(tmp_path)], ProjectConfig(root=tmp_path), jobs=1)
    writer.apply(result)
    by_name = {r.display.rsplit("/", 1)[-1]: r for r in result.files}
    assert by_name["ro.py"].status == engine.ERROR and not by_name["ro.py"].written
    assert by_name["ro.py"].findings and not any(f.fixed for f in by_name["ro.py"].findings)
    assert any(f.fixed for f in by_name["rw.py"].findings) and by_name["rw.py"].written
    assert ro.read_text() == SOURCE


def test_tune_nothing_fits_has_its_own_status(tmp_path, monkeypatch):
    from tputool.cli.tune import NOTHING_FITS

    monkeypatch.setattr("tputool.tune.tpu_compile.available", lambda: False)
    res = CliRunner().invoke(app, ["tune", "--model", "llama", "--target", "v5e-8", "--set", "dim=8192",
                                   "--set", "n_layers=80", "--set", "n_heads=64", "--set", "n_kv_heads=8",
                                   "--set", "ffn_dim=28672", "--set", "max_seq_len=4096", "--batch", "1",
                                   "--precision", "bf16", "--out", str(tmp_path / "t.yaml")])
    assert "nothing fits" in str(res.exception)
    assert res.exception.exit_code == NOTHING_FITS == 3
