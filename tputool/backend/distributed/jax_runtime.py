"""Starting JAX's multi-process runtime (`jax.distributed.initialize`) for a process group of world size > 1.

Where the coordinator comes from, first match wins:
  jax.distributed already initialized (by the user)   reused as it is;
  TPUTOOL_JAX_COORDINATOR=auto                         JAX's own detection (TPU VM / GKE / Slurm / MPI);
  TPUTOOL_JAX_COORDINATOR=host:port                    that address, process ids = torch ranks;
  otherwise                                            rank 0 picks a free port on its host (MASTER_ADDR, else
                                                       its host name) and publishes it through a store: under
                                                       torchrun its agent's store (MASTER_ADDR:MASTER_PORT), else
                                                       the group's c10d store. (JAX's coordinator never takes
                                                       torchrun's port itself.)
On a CPU host the collectives run over gloo (`jax_cpu_collectives_implementation`). JAX must not have started
its backend before. Under torchrun (world size > 1) `install_early_start` makes JAX's first backend creation
start the runtime first, so a script may make tpu tensors (or call torch.tpu.set_device) before
init_process_group; elsewhere a process that ran a tpu op first gets an error saying to call it earlier.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
from datetime import timedelta

import torch.distributed as dist

COORDINATOR_ENV = "TPUTOOL_JAX_COORDINATOR"
"""`auto` (JAX's cluster detection) or `host:port`; unset: negotiated through the c10d store."""

_KEY = "tputool/jax_coordinator"

TOO_LATE = (
    "tpu distributed backend: world_size={n} needs JAX's multi-process runtime, but JAX already started its "
    "backend in this process (a tpu tensor was made or torch.tpu was queried before init_process_group). "
    "Call dist.init_process_group(\"tpu\") before the first tpu op (or call jax.distributed.initialize() "
    "yourself at the top of the script).")


_failed: list[str] = []


def mark_failed(reason: str) -> None:
    """Record that a peer died or diverged: at exit this process then ends at once (status 1) instead of
    waiting in JAX's shutdown barrier for the missing rank (which would abort it minutes later)."""
    _failed.append(reason)


def _exit_if_failed() -> None:
    if _failed:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _exit_on_uncaught(previous):
    """sys.excepthook: report the exception as before, then mark the process failed (an uncaught exception
    ends this rank: its peers must not wait for it at JAX's shutdown barrier, nor it for them)."""

    def hook(kind, value, tb) -> None:
        previous(kind, value, tb)
        mark_failed(f"uncaught {kind.__name__}")

    return hook


def is_initialized() -> bool:
    """True once jax.distributed.initialize has run in this process."""
    from jax._src import distributed as jd

    return jd.global_state.client is not None


def backend_started() -> bool:
    """True once JAX has created its platform backends (after which initialize would be too late)."""
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def torchrun_job() -> tuple[str, int, int, int] | None:
    """(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE) in a worker torchrun started for more than one process."""
    e = os.environ
    if e.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or int(e.get("WORLD_SIZE", "1")) < 2:
        return None
    return e["MASTER_ADDR"], int(e["MASTER_PORT"]), int(e["RANK"]), int(e["WORLD_SIZE"])


def _negotiation_store(store: dist.Store | None, timeout: timedelta) -> tuple[dist.Store, str]:
    """The store the coordinator's address goes through, and its key (torchrun's agent store when there is one,
    so that the early start and init_process_group agree)."""
    job = torchrun_job()
    if job is None:
        assert store is not None
        return store, _KEY
    host, port, _, _ = job
    agent = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    return agent, f"{_KEY}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _coordinator(store: dist.Store | None, rank: int, timeout: timedelta) -> str:
    addr = os.environ.get(COORDINATOR_ENV)
    if addr:
        return addr
    store, key = _negotiation_store(store, timeout)
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        addr = f"{host}:{_free_port()}"
        store.set(key, addr)
        return addr
    store.wait([key], timeout)
    return store.get(key).decode()


def install_early_start() -> None:
    """In a torchrun worker of a job of > 1 processes, make JAX's first backend creation start its distributed
    runtime first (one wrapper around jax's `backends()`, removed on its first call: no later cost)."""
    if torchrun_job() is None or is_initialized():
        return
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return
    original = xla_bridge.backends

    def backends():
        xla_bridge.backends = original
        if not is_initialized() and not xla_bridge.backends_are_initialized():
            _, _, rank, world_size = torchrun_job()
            initialize(None, rank, world_size, EARLY_TIMEOUT)
        return original()

    xla_bridge.backends = backends


EARLY_TIMEOUT = timedelta(minutes=5)
"""How long the early start waits for the other processes (init_process_group's timeout is not known yet)."""


def initialize(store: dist.Store | None, rank: int, world_size: int, timeout: timedelta) -> None:
    """Start JAX's distributed runtime for `world_size` processes (once; a no-op when it already runs)."""
    if is_initialized():
        return
    if backend_started():
        raise RuntimeError(TOO_LATE.format(n=world_size))
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # (CPU devices only; TPUs use ICI/DCN)
    atexit.register(_exit_if_failed)
    sys.excepthook = _exit_on_uncaught(sys.excepthook)
    wait_s = max(1, int(timeout.total_seconds()))
    addr = _coordinator(store, rank, timeout)
    if addr == "auto":
        jax.distributed.initialize(initialization_timeout=wait_s)
    else:
        jax.distributed.initialize(addr, num_processes=world_size, process_id=rank, initialization_timeout=wait_s)
