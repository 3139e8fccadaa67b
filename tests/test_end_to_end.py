"""The promise end to end: `tputool port --write` on the CUDA sample repo, then the ported script trains on tpu."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from tputool.cli import app

SAMPLE = Path(__file__).resolve().parents[1] / "fixtures" / "sample_repo"


def test_ported_sample_repo_trains_on_the_tpu_device(tmp_path):
    repo = tmp_path / "sample_repo"
    shutil.copytree(SAMPLE, repo)
    res = CliRunner().invoke(app, ["port", str(repo), "--write", "-q"])
    assert res.exit_code == 0, res.output
    assert ".cuda(" not in (repo / "train.py").read_text()

    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": "29534"}
    run = subprocess.run([sys.executable, "train.py", "--epochs", "1"], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"loss (\d+\.\d+)", run.stdout)]
    assert len(losses) >= 5 and all(0 < x < 10 for x in losses), run.stdout
    assert "fallback" not in run.stderr.lower(), run.stderr[-3000:]
    # (DDP's C++ logger would print this for a device without a timer: `backend/distributed/ddp_stats.py`)
    assert "Time stats are currently only collected" not in run.stderr, run.stderr[-3000:]
