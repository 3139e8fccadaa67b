"""`tputool launch --via local`: a slice's process layout rehearsed on this machine. One process per host
(as on a TPU VM: one JAX process drives all of a host's chips), each with its chips as CPU devices and the
environment its TPU host would give it (`TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES` with every host at 127.0.0.1,
`TPU_ACCELERATOR_TYPE`, `MEGASCALE_*` for several slices), each running the same host command (`host.py`) as
the slice does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tputool.launch import XLA_DEVICES_FLAG
from tputool.launch.writers import Launch

LOOPBACK = "127.0.0.1"


def host_environments(lc: Launch, environ: dict[str, str]) -> list[dict[str, str]]:
    """The environment of each host of the job, slice by slice (what a TPU VM / GKE pod would set)."""
    sl = lc.slice
    flags = [f for f in environ.get("XLA_FLAGS", "").split() if not f.startswith(XLA_DEVICES_FLAG)]
    devices = sl.chips_per_host * sl.chip.devices_per_chip
    base = {**environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join([*flags, f"{XLA_DEVICES_FLAG}={devices}"]),
            "TPU_WORKER_HOSTNAMES": ",".join([LOOPBACK] * sl.hosts), "TPU_ACCELERATOR_TYPE": sl.cloud_name,
            "TPU_SKIP_MDS_QUERY": "true"}
    out = []
    for s in range(sl.slices):
        mega = {"MEGASCALE_COORDINATOR_ADDRESS": LOOPBACK, "MEGASCALE_NUM_SLICES": str(sl.slices),
                "MEGASCALE_SLICE_ID": str(s), "MEGASCALE_PORT": "8080"} if sl.slices > 1 else {}
        out += [{**base, **mega, "TPU_WORKER_ID": str(w)} for w in range(sl.hosts)]
    return out


def start_hosts(lc: Launch, hosts: list[int] | None = None, **popen: object) -> list[subprocess.Popen]:
    """Start the host command for each host index in `hosts` (default: all) with its environment (`popen`:
    more subprocess.Popen arguments, e.g. to capture the output)."""
    envs = host_environments(lc, dict(os.environ))
    argv = [sys.executable, *lc.host_argv()[1:]]
    return [subprocess.Popen(argv, env=envs[i], **popen) for i in (range(len(envs)) if hosts is None else hosts)]


def run_local(lc: Launch) -> int:
    """Run every host's process here and wait: 0, else the first failure's status (the others are stopped a
    few seconds after a failure, as a slice's job is when one host fails)."""
    procs = start_hosts(lc)
    try:
        failed_at = None
        while any(p.poll() is None for p in procs):
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > 30:
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGTERM)
            time.sleep(0.1)
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        return 130
    return next((p.returncode for p in procs if p.returncode), 0)
