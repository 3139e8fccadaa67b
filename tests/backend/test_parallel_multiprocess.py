"""Two processes under torchrun on the tpu device: DDP and FSDP2 training of the tiny Llama, compiled functional
collectives and the ported CUDA sample repo, each against the same script on CPU tensors with torch's gloo group.

The worker is fixtures/parallel_worker.py (every rank saves its losses and final weights); ranks get different
data, so the gradient reduction matters.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

WORKER = Path(__file__).resolve().parent / "fixtures" / "parallel_worker.py"
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "fixtures" / "sample_repo"
NPROC = 2
LOSS_TOL = {"rtol": 1e-4, "atol": 1e-5}
PARAM_TOL = {"rtol": 1e-3, "atol": 1e-3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(args: list[str], cwd: Path, timeout: int = 600, **extra: str) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --nproc_per_node=NPROC ARGS` in `cwd`, with this tree's tputool (and
    the environment variables `extra`)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", **extra}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={NPROC}",
           f"--master_port={_free_port()}", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _check(run: subprocess.CompletedProcess, device: str) -> None:
    assert run.returncode == 0, run.stderr[-4000:]


def _ranks(mode: str, device: str, tmp_path: Path, **env: str) -> list[dict]:
    out = tmp_path / f"{mode}-{device}"
    out.mkdir()
    _check(torchrun([str(WORKER), mode, device, str(out)], tmp_path, **env), device)
    return [torch.load(out / f"rank{r}.pt") for r in range(NPROC)]


@pytest.mark.parametrize("mode", ["ddp", "fsdp2"])
def test_two_process_training_matches_gloo_on_cpu(mode: str, tmp_path: Path) -> None:
    cpu = _ranks(mode, "cpu", tmp_path)
    assert cpu[0]["losses"] != cpu[1]["losses"]  # (each rank trains on its own data)
    torch.testing.assert_close(cpu[0]["state"], cpu[1]["state"])  # (and the gradients are reduced)
    tpu = _ranks(mode, "tpu", tmp_path)
    for want, got in zip(cpu, tpu, strict=True):
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]), **LOSS_TOL)
        torch.testing.assert_close(got["state"], want["state"], **PARAM_TOL)


def test_two_process_ddp_in_fused_eager_mode_matches_gloo_on_cpu(tmp_path: Path) -> None:
    """DDP with the tpu steps deferred and fused. Without the signature exchange and with rank 0 late to each
    bucket's all-reduce, rank 1's collective is still pending when its optimizer step's flush donates the
    buffers the collective reads (which failed with "deleted or donated buffer" until collectives waited)."""
    env = {"WORKER_RANK0_LATE": "0.3", "TPUTOOL_DIST_CHECKS": "0"}
    cpu = _ranks("ddp", "cpu", tmp_path, **env)
    tpu = _ranks("ddp-fused", "tpu", tmp_path, **env)
    assert tpu[0]["mode"] == "fused"
    for want, got in zip(cpu, tpu, strict=True):
        torch.testing.assert_close(torch.tensor(got["losses"]), torch.tensor(want["losses"]), **LOSS_TOL)
        torch.testing.assert_close(got["state"], want["state"], **PARAM_TOL)


def test_two_process_compiled_collectives_match_gloo_on_cpu(tmp_path: Path) -> None:
    cpu = _ranks("compiled", "cpu", tmp_path)
    torch.testing.assert_close(cpu[0]["compiled"], cpu[0]["eager"])
    assert not torch.equal(cpu[0]["eager"], cpu[1]["eager"])
    tpu = _ranks("compiled", "tpu", tmp_path)
    for want, got in zip(cpu, tpu, strict=True):
        torch.testing.assert_close(got["eager"], want["eager"])
        torch.testing.assert_close(got["compiled"], want["eager"])
        # each whole graph, collectives included, as one computation (random draws too: test_compiled_collectives_mp)
        assert got["graphs"] == {"one_program": 2}, got["warnings"]
        torch.testing.assert_close(got["noisy"], want["noisy"])


@pytest.mark.slow  # (~1 min; the one-process run of the same port is in tests/test_end_to_end.py)
def test_ported_sample_repo_trains_under_torchrun_on_tpu(tmp_path: Path) -> None:
    from tputool.cli import app

    repo = tmp_path / "sample_repo"
    shutil.copytree(SAMPLE, repo)
    res = CliRunner().invoke(app, ["port", str(repo), "--write", "-q"])
    assert res.exit_code == 0, res.output
    assert 'init_process_group("tpu")' in (repo / "train.py").read_text()
    run = torchrun(["train.py", "--epochs", "1", "--batch-size", "64", "--log-every", "8"], repo)
    _check(run, "tpu")
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", run.stdout)]
    assert len(losses) >= 2 * NPROC and all(0 < x < 10 for x in losses), run.stdout
    assert "fallback" not in run.stderr.lower(), run.stderr[-3000:]
    assert (repo / "checkpoint.pt").exists()
