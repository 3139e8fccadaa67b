"""`tputool launch --via local`: a slice's hosts as local processes, each with its chips as CPU devices and the
TPU environment, running the same host command as the slice; a DDP step over them equals the single-process
step, and a host that never starts is named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tputool.backend.distributed.jax_runtime import _free_port
from tputool.launch.local import start_hosts
from tputool.launch.writers import make_launch
from tputool.tune.slices import parse_target

ROOT = Path(__file__).resolve().parents[2]
STEP = Path(__file__).resolve().parent / "fixtures" / "ddp_step.py"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
       "OMP_NUM_THREADS": "1"}


def _launch_local(target: str, out: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tputool", "launch", "--target", target, "--via", "local", str(STEP), str(out)]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)


def _single(out: Path) -> dict:
    env = {k: v for k, v in ENV.items() if not k.startswith(("TPU_", "MEGASCALE_", "RANK", "WORLD_SIZE"))}
    r = subprocess.run([sys.executable, str(STEP), str(out)], env={**env, "JAX_PLATFORMS": "cpu"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out / "rank0.pt")


def _check_layout(target: str, tmp_path: Path) -> list[dict]:
    sl = parse_target(target)
    r = _launch_local(target, tmp_path)
    assert r.returncode == 0, "\n".join(ln for ln in r.stderr.splitlines() if "[Gloo]" not in ln)[-6000:]
    n = sl.hosts * sl.slices
    results = [torch.load(tmp_path / f"rank{i}.pt") for i in range(n)]
    for rank, res in enumerate(results):
        info = res["info"]
        assert (info["world"], info["devices"], info["local"], info["process"]) == \
            (n, sl.n_devices, sl.chips_per_host * sl.chip.devices_per_chip, rank)
        assert info["env"]["TPU_WORKER_ID"] == str(rank % sl.hosts)
        assert info["env"]["TPU_ACCELERATOR_TYPE"] == sl.cloud_name
        assert info["env"]["MEGASCALE_SLICE_ID"] == (str(rank // sl.hosts) if sl.slices > 1 else None)
    return results


def test_ddp_on_a_two_host_slice_equals_one_process(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "slice").mkdir()
    single = _single(tmp_path / "one")
    results = _check_layout("v5p-16", tmp_path / "slice")  # 2 hosts x 4 chips
    for res in results:
        for k, v in single["state"].items():
            torch.testing.assert_close(res["state"][k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["v5e-16", "v4-16x2"])  # 4 hosts x 4 chips; 2 slices x 2 hosts
def test_realistic_layouts(target, tmp_path):
    results = _check_layout(target, tmp_path)
    for res in results[1:]:
        for k, v in results[0]["state"].items():
            torch.testing.assert_close(res["state"][k], v)


@pytest.mark.parametrize(("start", "named"), [
    (0, "host(s) worker 1 (127.0.0.1, rank 1) of v5p-16 never started within 5s"),
    (1, "the first host, worker 0 (127.0.0.1, rank 0) at 127.0.0.1:"),
])
def test_a_host_that_never_starts_is_named(tmp_path, monkeypatch, start, named):
    monkeypatch.setenv("PYTHONPATH", ENV["PYTHONPATH"])
    lc = make_launch(parse_target("v5p-16"), str(STEP), [str(tmp_path)], port=_free_port(), host_timeout=5)
    (host,) = start_hosts(lc, [start], stderr=subprocess.PIPE, text=True)
    _, err = host.communicate(timeout=120)
    assert host.returncode == 1, err[-3000:]
    assert named in err, err[-3000:]
    assert not list(tmp_path.glob("rank*.pt"))  # (the script never ran)
