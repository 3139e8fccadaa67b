"""Fork safety: a process forked after JAX started (a DataLoader worker) never touches JAX, and forks quietly.

JAX is multithreaded and its threads do not survive `fork()`: a tpu op in such a child hangs (checked: a
DataLoader worker building a tpu tensor waits forever). So, as CUDA does ("Cannot re-initialize CUDA in forked
subprocess"), in that child:
- `torch.tpu._is_in_bad_fork()` is True, so `torch.manual_seed` (every DataLoader worker calls it) leaves the
  tpu stream alone;
- every tpu op raises a RuntimeError saying why (the device's kernels are swapped for one that refuses),
  instead of hanging.
With the child guarded, JAX's "os.fork() was called ... deadlock" warning is silenced for the forks
`multiprocessing` makes (DataLoader workers); a bare `os.fork()` still warns.

Why not make DataLoader use 'spawn' or 'forkserver' for tpu runs: both pickle the dataset and re-import the
user's main module, which breaks scripts written for CUDA's fork (no `if __name__ == "__main__":` guard,
lambdas or open handles in datasets), and start every worker from scratch (seconds of imports per epoch).
"""

from __future__ import annotations

import os
import warnings

from tputool.backend.runtime import STATE

FORKED_MESSAGE = ("tpu: cannot use the tpu device in a forked subprocess (e.g. a DataLoader worker): JAX, which "
                  "runs it, does not survive fork(). Return CPU tensors from the worker and move batches to tpu "
                  "in the main process, or use the 'spawn' start method.")

_device_libs: list = []
_installed = False


def install(device_libs: list) -> None:
    """Guard forked children (once); `device_libs`: the torch.library registrations of the tpu kernels."""
    global _installed
    _device_libs[:] = device_libs
    if _installed or not hasattr(os, "register_at_fork"):
        return
    os.register_at_fork(after_in_child=_after_fork_in_child)
    warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning,
                            module=r"multiprocessing\.popen_fork")
    _installed = True


def in_bad_fork() -> bool:
    """True in a child forked after JAX started: the tpu device is unusable there."""
    return STATE.bad_fork


def _jax_started() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge._backends)  # (read without its lock: another thread may have held it at fork)
    except (ImportError, AttributeError):
        return True


def _after_fork_in_child() -> None:
    if STATE.bad_fork or not _jax_started():
        return  # (JAX not started: the child may start its own)
    STATE.bad_fork = True
    import torch

    if STATE.mode is STATE.mode.DEFER_AND_FUSE:  # Fused would record the child's ops instead of refusing them
        from tputool.backend import fused

        fused.leave_in_forked_child()

    for lib in _device_libs:
        lib._destroy()
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_refuse, dispatch_key="PrivateUse1", with_keyset=True)
    _device_libs[:] = [lib]


def _refuse(keyset, op, *args, **kwargs):  # noqa: ANN001 - the boxed fallback's signature
    raise RuntimeError(f"{FORKED_MESSAGE} (op: {op})")
