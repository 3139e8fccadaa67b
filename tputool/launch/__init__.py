"""`tputool run --nproc N script.py`: N local processes through torchrun's own launcher (torch.distributed.run),
each with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), so that a pod's process
layout is dry-run on one machine: `init_process_group("tpu")` in each starts JAX's distributed runtime, one
device per process (`cpu_devices` simulated CPU devices each, the first being the process's rank device).

`tputool launch` (a slice's hosts) lives in the submodules: `writers` (JobSet, xpk, gcloud, Ray), `host` (the
command every host runs), `local` (the slice's layout rehearsed here), `ray_driver` (the Ray job's driver).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tputool.errors import UserError

XLA_DEVICES_FLAG = "--xla_force_host_platform_device_count"


def launch_env(cpu_devices: int | None, environ: dict[str, str]) -> dict[str, str]:
    """The environment variables the workers need on top of `environ` (simulated CPU devices, if asked)."""
    if not cpu_devices:
        return {}
    if cpu_devices < 1:
        raise UserError(f"--cpu-devices must be >= 1, got {cpu_devices}")
    flags = [f for f in environ.get("XLA_FLAGS", "").split() if not f.startswith(XLA_DEVICES_FLAG)]
    return {"XLA_FLAGS": " ".join([*flags, f"{XLA_DEVICES_FLAG}={cpu_devices}"]), "JAX_PLATFORMS": "cpu"}


def torchrun_args(script: str, args: list[str], nproc: int, master_port: int | None = None) -> list[str]:
    """torchrun's command line for `nproc` local workers running `script args` (a free port unless given)."""
    if nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {nproc}")
    if not Path(script).is_file():
        raise UserError(f"{script}: no such script")
    port = [f"--master_port={master_port}"] if master_port else ["--standalone"]
    return [f"--nproc_per_node={nproc}", *port, script, *args]


def launch_local(script: str, args: list[str], nproc: int, cpu_devices: int | None = None,
                 master_port: int | None = None) -> int:
    """Run `script` in `nproc` local processes under torchrun's launcher; 0, 1 when a worker failed, or 128 +
    the signal that interrupted the launcher (its workers stopped)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    argv = torchrun_args(script, args, nproc, master_port)
    os.environ.update(launch_env(cpu_devices, dict(os.environ)))
    try:
        run(get_args_parser().parse_args(argv))
    except ChildFailedError as e:
        print(e.format_msg(), file=sys.stderr)
        return 1
    except SignalException as e:  # (Ctrl-C or a kill: torchrun's agent has already stopped every worker)
        print(f"tputool run: interrupted ({e.sigval.name}): every worker was stopped", file=sys.stderr)
        return 128 + int(e.sigval)
    return 0
