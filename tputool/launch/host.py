"""The command every host of a slice runs (`python -m tputool.launch.host --target T -- script.py args`).

It reads the environment a TPU VM or GKE TPU pod gives (`TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES`, and
`MEGASCALE_*` for multi-slice; on a plain TPU VM, where ssh sessions lack them, the VM's metadata as JAX reads
it), checks it against the slice the launch was written for (host count, accelerator type, slice count: a
mismatch is one line and exit 2, before anything starts), and runs the script as one process of the job with
torchrun's environment: RANK = slice * hosts + worker (JAX's own process id on TPUs), WORLD_SIZE = all hosts,
MASTER_ADDR = the first host of the first slice. `init_process_group("tpu")` then starts JAX's runtime there.

As torchrun's agent does, the command on the first host holds the job's c10d store (MASTER_ADDR:MASTER_PORT;
the script's process group and JAX's coordinator negotiation use it, TORCHELASTIC_USE_AGENT_STORE) and runs the
script as its child. Before the script starts, every host answers a roll call in the store: a host that never
starts is named (slice, worker, host name, rank) by every other host within `--host-timeout` (default: the
process group's, 30 minutes), and they exit with status 1 instead of waiting in the first collective.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta

from tputool.errors import UserError
from tputool.tune.slices import Slice, parse_target

DEFAULT_PORT = 29500
"""The c10d store's port on the first host (torchrun's default)."""


@dataclass(frozen=True)
class HostInfo:
    """What the TPU environment says about this host."""

    worker: int  # index in its slice
    hostnames: tuple[str, ...]  # the slice's hosts, in worker order
    accelerator: str | None  # TPU_ACCELERATOR_TYPE, when given
    slices: int
    slice_id: int
    megascale_coordinator: str | None


def read_tpu_env(environ: dict[str, str]) -> HostInfo:
    """This host's place in the slice from `environ` (GKE, `--via local`), else the TPU VM's metadata."""
    if "TPU_WORKER_HOSTNAMES" in environ or "TPU_PROCESS_ADDRESSES" in environ:
        names = environ.get("TPU_PROCESS_ADDRESSES") or environ["TPU_WORKER_HOSTNAMES"]
        if "TPU_WORKER_ID" not in environ:
            raise UserError("TPU_WORKER_HOSTNAMES is set but TPU_WORKER_ID is not: which host is this?")
        worker, hostnames = int(environ["TPU_WORKER_ID"]), names.split(",")
        env = environ.get
    else:  # a TPU VM reached by ssh: JAX's reader of the metadata server
        try:
            from jax._src.clusters import cloud_tpu_cluster as c

            worker = c.GceTpuCluster._get_process_id_in_slice()
            hostnames = c.GceTpuCluster._get_worker_list_in_slice()
        except Exception as e:  # noqa: BLE001 - no metadata server: not on a TPU VM
            raise UserError(f"not on a TPU host: no TPU_WORKER_HOSTNAMES and no TPU VM metadata ({e})") from None

        def env(key: str, default: str | None = None) -> str | None:
            value = environ.get(key)
            return value if value is not None else (c.get_tpu_env_value(key) or default)
    return HostInfo(worker, tuple(h.strip() for h in hostnames), env("TPU_ACCELERATOR_TYPE"),
                    int(env("MEGASCALE_NUM_SLICES") or 1), int(env("MEGASCALE_SLICE_ID") or 0),
                    env("MEGASCALE_COORDINATOR_ADDRESS"))


def check_host(info: HostInfo, sl: Slice) -> None:
    """UserError naming the difference when this host's environment is not a host of slice `sl`."""
    if info.accelerator and parse_target(info.accelerator) != Slice(sl.chip, sl.topology):
        raise UserError(f"this host is part of a {info.accelerator} slice, but the job was written for "
                        f"{sl.cloud_name}")
    if len(info.hostnames) != sl.hosts:
        raise UserError(f"the slice lists {len(info.hostnames)} host(s) (TPU_WORKER_HOSTNAMES), but {sl.name} has "
                        f"{sl.hosts}")
    if not 0 <= info.worker < sl.hosts:
        raise UserError(f"TPU_WORKER_ID {info.worker} is outside the slice's {sl.hosts} host(s)")
    if info.slices != sl.slices:
        raise UserError(f"the job runs on {info.slices} slice(s) (MEGASCALE_NUM_SLICES), but {sl.name} has "
                        f"{sl.slices}")
    if not 0 <= info.slice_id < sl.slices:
        raise UserError(f"MEGASCALE_SLICE_ID {info.slice_id} is outside the job's {sl.slices} slice(s)")
    if sl.slices > 1 and not info.megascale_coordinator:
        raise UserError("a multi-slice job needs MEGASCALE_COORDINATOR_ADDRESS (the first host of slice 0)")


def torch_env(info: HostInfo, sl: Slice, port: int) -> dict[str, str]:
    """torchrun's variables for this host's one process (as torchrun sets them for one process per node)."""
    rank = info.slice_id * sl.hosts + info.worker
    master = (info.megascale_coordinator or info.hostnames[0]).rsplit(":", 1)[0] if sl.slices > 1 \
        else info.hostnames[0]
    world = sl.hosts * sl.slices
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": str(rank), "GROUP_WORLD_SIZE": str(world), "MASTER_ADDR": master,
            "MASTER_PORT": str(port)}


def config_file(encoded: str) -> str:
    """Write a base64 tputool-tune.yaml (what `--config` put in the launch) to a file; its path."""
    fd, path = tempfile.mkstemp(prefix="tputool-tune-", suffix=".yaml")
    with os.fdopen(fd, "wb") as f:
        f.write(base64.b64decode(encoded))
    return path


_ROLL = "tputool/launch/host/{}"
_DONE = "tputool/launch/done/{}"


def describe_rank(rank: int, sl: Slice, hostnames: tuple[str, ...]) -> str:
    """`slice 0 worker 1 (127.0.0.1, rank 1)`: a rank of the job in the slice's words."""
    worker = rank % sl.hosts
    host = hostnames[worker] if worker < len(hostnames) else "?"
    where = f"slice {rank // sl.hosts} worker {worker}" if sl.slices > 1 else f"worker {worker}"
    return f"{where} ({host}, rank {rank})"


def roll_call(store, rank: int, world: int, timeout_s: float) -> list[int]:
    """Post this rank in `store` and wait for every rank's post, at most `timeout_s`; the ranks still missing."""
    store.set(_ROLL.format(rank), "1")
    deadline = time.monotonic() + timeout_s
    missing = list(range(world))
    while missing:
        missing = [r for r in missing if not store.check([_ROLL.format(r)])]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return missing


def _run_child(argv: list[str], env: dict[str, str]) -> int:
    child = subprocess.Popen(argv, env=env)

    def forward(signum, _frame) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    return child.wait()


def parser() -> argparse.ArgumentParser:
    """The host command's arguments (what the launchers' commands hold after `-m tputool.launch.host`)."""
    from torch.distributed.constants import default_pg_timeout

    p = argparse.ArgumentParser(prog="python -m tputool.launch.host")
    p.add_argument("--target", required=True)
    p.add_argument("--master-port", type=int, default=DEFAULT_PORT)
    p.add_argument("--host-timeout", type=float, default=default_pg_timeout.total_seconds())
    p.add_argument("--config-b64")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    return p


def main(argv: list[str] | None = None) -> None:
    """Check this host against the target, answer the roll call, run the script (see the module doc)."""
    from torch.distributed import TCPStore

    a = parser().parse_args(argv)
    try:
        sl = parse_target(a.target)
        info = read_tpu_env(dict(os.environ))
        check_host(info, sl)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
    tenv = torch_env(info, sl, a.master_port)
    rank, world = int(tenv["RANK"]), int(tenv["WORLD_SIZE"])
    me = f"tputool launch: {describe_rank(rank, sl, info.hostnames)}"
    timeout = timedelta(seconds=a.host_timeout)
    try:
        store = TCPStore(tenv["MASTER_ADDR"], a.master_port, world, rank == 0, timeout, wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - DistNetworkError/DistStoreError: the first host is not there
        print(f"{me}: the first host, {describe_rank(0, sl, info.hostnames)} at {tenv['MASTER_ADDR']}:"
              f"{a.master_port}, never started within {a.host_timeout:g}s ({type(e).__name__})", file=sys.stderr)
        sys.exit(1)
    missing = roll_call(store, rank, world, a.host_timeout)
    if missing:
        names = ", ".join(describe_rank(r, sl, info.hostnames) for r in missing)
        print(f"{me}: host(s) {names} of {sl.name} never started within {a.host_timeout:g}s", file=sys.stderr)
        sys.exit(1)
    env = {**os.environ, **tenv, "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "0"}
    if a.config_b64:
        from tputool.tune.config import ENV_VAR

        env[ENV_VAR] = config_file(a.config_b64)
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    code = _run_child([sys.executable, a.script, *args], env)
    store.set(_DONE.format(rank), str(code))
    if rank == 0:  # (hold the store until every host's script has ended, as torchrun's agents' exit barrier)
        deadline = time.monotonic() + a.host_timeout
        while time.monotonic() < deadline and not store.check([_DONE.format(r) for r in range(world)]):
            time.sleep(0.2)
    sys.exit(code if code >= 0 else 128 - code)


if __name__ == "__main__":
    main()
