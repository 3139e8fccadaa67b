"""Starting JAX's multi-process runtime (`jax.distributed.initialize`) for a process group of world size > 1.

Where the coordinator comes from, first match wins:
  jax.distributed already initialized (by the user)   reused as it is;
  TPUTOOL_JAX_COORDINATOR=auto                         JAX's own detection (TPU VM / GKE / Slurm / MPI);
  TPUTOOL_JAX_COORDINATOR=host:port                    that address, process ids = torch ranks;
  otherwise                                            rank 0 picks a free port on its host (MASTER_ADDR, else
                                                       its host name) and publishes it through the c10d store
                                                       (not torchrun's TCPStore port itself).
On a CPU host the collectives run over gloo (`jax_cpu_collectives_implementation`). JAX must not have started
its backend before: a process that ran a tpu op first gets an error saying to call init_process_group earlier.
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


def is_initialized() -> bool:
    """True once jax.distributed.initialize has run in this process."""
    from jax._src import distributed as jd

    return jd.global_state.client is not None


def backend_started() -> bool:
    """True once JAX has created its platform backends (after which initialize would be too late)."""
    from jax._src import xla_bridge

    return bool(xla_bridge._backends)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _coordinator(store: dist.Store, rank: int, timeout: timedelta) -> str:
    addr = os.environ.get(COORDINATOR_ENV)
    if addr:
        return addr
    if rank == 0:
        host = os.environ.get("MASTER_ADDR") or socket.gethostname()
        addr = f"{host}:{_free_port()}"
        store.set(_KEY, addr)
        return addr
    store.wait([_KEY], timeout)
    return store.get(_KEY).decode()


def initialize(store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
    """Start JAX's distributed runtime for `world_size` processes (once; a no-op when it already runs)."""
    if is_initialized():
        return
    if backend_started():
        raise RuntimeError(TOO_LATE.format(n=world_size))
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # (CPU devices only; TPUs use ICI/DCN)
    atexit.register(_exit_if_failed)
    wait_s = max(1, int(timeout.total_seconds()))
    addr = _coordinator(store, rank, timeout)
    if addr == "auto":
        jax.distributed.initialize(initialization_timeout=wait_s)
    else:
        jax.distributed.initialize(addr, num_processes=world_size, process_id=rank, initialization_timeout=wait_s)
