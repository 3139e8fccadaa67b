"""The tpu process group across processes (torchrun on this host, JAX's distributed runtime over gloo):
every collective against torch's gloo on CPU tensors, and the faults (a dead rank, different calls) named."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).parent / "fixtures" / "dist_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(nproc: int, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """Run the worker under torchrun with `nproc` local processes; its output as text."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "OMP_NUM_THREADS": "1", **env}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={_free_port()}", str(WORKER), *args]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def _every_collective(run: subprocess.CompletedProcess, nproc: int, local: int) -> None:
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    for r in range(nproc):
        assert re.search(rf"RANK {r} OK \d+ local devices {local} of {nproc * local}", out), out[-4000:]


def test_every_collective_matches_gloo_on_2_processes_launched_by_tputool_run() -> None:
    """`tputool run --nproc 2 --cpu-devices 2`: torchrun's launcher, two simulated devices per process (the
    first is the rank's device)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "tputool", "run", "--nproc", "2", "--cpu-devices", "2", str(WORKER)],
                         env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    _every_collective(run, 2, 2)


def test_a_group_bound_to_each_ranks_device_makes_meshes_and_async_collectives() -> None:
    """`init_process_group("tpu", device_id=torch.device("tpu", local_rank))` (nanochat) failed: "No backend type
    associated with device type tpu"."""
    run = torchrun(2, "device_id")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert all(f"RANK {r} DEVICE_ID OK" in out for r in range(2)), out[-4000:]


@pytest.mark.slow
def test_every_collective_matches_gloo_on_4_processes() -> None:
    _every_collective(torchrun(4), 4, 1)


def test_run_needs_config_or_nproc_and_checks_them(tmp_path) -> None:
    from typer.testing import CliRunner

    from tputool.cli import app
    from tputool.errors import UserError

    script = tmp_path / "s.py"
    script.write_text("pass\n")
    res = CliRunner().invoke(app, ["run", str(script)])
    assert res.exit_code == 2 and "--config" in res.output and "--nproc" in res.output
    res = CliRunner().invoke(app, ["run", "--nproc", "0", str(script)])  # (checked up front, as every range)
    assert res.exit_code == 2 and "--nproc" in res.output and ">= 1" in res.output.replace("greater than or equal to", ">=")
    res = CliRunner().invoke(app, ["run", "--nproc", "2", str(tmp_path / "missing.py")])
    assert isinstance(res.exception, UserError) and "no such script" in str(res.exception)


def test_early_tpu_op_then_a_dead_rank_and_different_calls_named_within_the_timeout() -> None:
    start = time.perf_counter()
    run = torchrun(2, "faults", timeout=240, WORKER_TIMEOUT="10")
    wall = time.perf_counter() - start
    out = run.stdout + run.stderr
    assert run.returncode != 0
    for r in (0, 1):  # (a tpu op before init_process_group started JAX's runtime first)
        assert f"RANK {r} EARLY [0, 2, 4] in 2 processes" in out, out[-4000:]
    for r, other in ((0, 1), (1, 0)):
        assert re.search(rf"RANK {r} MISMATCH: .*collective #1 differs across ranks: rank {r} called "
                         rf"all_reduce\(SUM\) float32\[{4 + r}\] but rank {other} called "
                         rf"all_reduce\(SUM\) float32\[{4 + other}\]", out), out[-4000:]
    # (rank 1's process ended: its heartbeat stopped, so rank 0 names it before the 10 s timeout)
    m = re.search(r"RANK 0 DEAD after ([\d.]+)s: .*rank\(s\) 1 of 2 stopped \(no heartbeat for 4s\) before joining",
                  out)
    assert m, out[-4000:]
    assert float(m.group(1)) < 10
    assert wall < 150, f"the job took {wall:.0f}s to end after a rank died"


def test_a_clean_run_with_late_ranks_prints_no_store_timeouts() -> None:
    """A rank that reaches a collective seconds after its peer is waited for without torch's TCPStore printing
    `waitForInput ... timed out` (the exchange polls the store instead of timed-out waits)."""
    run = torchrun(2, "late", timeout=240)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    n = 2
    for r in range(n):  # ((1 + 2) summed, doubled by each further all_reduce)
        assert f"RANK {r} LATE OK {[3.0 * n ** (n - 1)] * 3}" in out, out[-4000:]
    assert "waitForInput" not in out and "timed out" not in out, out[-4000:]
