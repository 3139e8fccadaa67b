"""`tputool diagnose --target SLICE` and the libtpu wheel's effect on a CPU process (extra `tpu-compile`,
which `make install` installs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("libtpu")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "JAX_PLATFORM_NAME")}
    return {**env, **extra}


def test_import_torch_with_libtpu_installed_is_quiet_and_on_cpu():
    """libtpu installed, no TPU attached: `import torch` (which starts JAX) prints nothing and JAX stays on
    CPU; compile-only TPU devices still come from a topology."""
    code = ("import torch, jax\n"
            "print((torch.ones(2, device='tpu') + 1).sum().item(), jax.devices()[0].platform)\n"
            "import sys; print('MARK', file=sys.stderr, flush=True)\n"
            "from jax.experimental import topologies\n"
            "print(len(topologies.get_topology_desc(topology_name='v5e:2x2', platform='tpu').devices))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["4.0", "cpu", "4"]
    before_topology = out.stderr.split("MARK")[0]  # (get_topology_desc prints libtpu's start-up lines itself)
    assert "TPU_WORKER_HOSTNAMES" not in before_topology and "INVALID_ARGUMENT" not in before_topology
