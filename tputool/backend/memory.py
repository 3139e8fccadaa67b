"""Device memory, as CUDA code expects it: out-of-memory as `torch.OutOfMemoryError`, impossible allocations
refused at the call, and the statistics behind `torch.tpu.memory_allocated` & co.

Statistics come from `jax.Device.memory_stats()` where the platform reports them (TPU, GPU: `bytes_in_use`,
`peak_bytes_in_use`, `bytes_limit`). The CPU platform reports none; there the allocated bytes are counted
exactly from the live JAX arrays on the device at each query, the capacity is the host's memory, and the
peak is the highest count seen by a query since the last reset (a sampled peak, not every allocation's).
"""

from __future__ import annotations

import os

import jax
import torch

from tputool.backend.runtime import STATE

CHECK_FROM: int = 0
"""Allocations of at least this many bytes are checked against free memory (`check_alloc`): a sixteenth of
the device's capacity, set on the first allocation (0 until then, so the first one sets it)."""

_OOM_MARKS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


def _device() -> jax.Device:
    return jax.local_devices()[0]  # (eager tpu tensors live on tpu:0, this process's first device)


def _device_stats() -> dict | None:
    try:
        return _device().memory_stats() or None
    except Exception:  # noqa: BLE001 - some platforms do not implement memory stats
        return None


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory (Linux's MemAvailable where readable)."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f if line.split()}
        return info["MemAvailable"], info["MemTotal"]
    except (OSError, KeyError, ValueError, IndexError):
        page = os.sysconf("SC_PAGE_SIZE")
        return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _live_bytes() -> int:
    """Bytes of the live JAX arrays held on the device (each array once; its shard only, when sharded)."""
    dev = _device()
    total = 0
    for a in jax.live_arrays():
        if a.is_deleted():
            continue
        sh = a.sharding
        if dev not in sh.device_set:
            continue
        if len(sh.device_set) == 1:
            total += a.nbytes
        else:
            shape = sh.shard_shape(a.shape)
            n = a.dtype.itemsize
            for s in shape:
                n *= s
            total += n
    return total


def mem_get_info() -> tuple[int, int]:
    """(free, total) bytes of device memory (host memory where the platform reports none)."""
    s = _device_stats()
    if s is not None and "bytes_limit" in s:
        return max(s["bytes_limit"] - s.get("bytes_in_use", 0), 0), s["bytes_limit"]
    return _host_memory()


def allocated() -> int:
    """Bytes held by live tensors on the device now (and the peak updated with it)."""
    from tputool.backend.tensor import Uninit  # (tensor imports this module)

    s = _device_stats()
    cur = s["bytes_in_use"] if s is not None and "bytes_in_use" in s else _live_bytes()
    cur += Uninit.live_bytes  # tensors made by `empty` and not yet written hold their bytes too
    if STATE.trace is not None:  # and Fused mode's pending values, counted when their op is recorded
        cur += STATE.trace.pending_bytes()
    if cur > STATE.mem_peak:
        STATE.mem_peak = cur
    return cur


def max_allocated() -> int:
    """The most bytes held at once since start or `reset_peak()`."""
    cur = allocated()
    s = _device_stats()
    dev_peak = s.get("peak_bytes_in_use") if s is not None else None
    if dev_peak is not None and dev_peak > STATE.mem_device_peak_at_reset:
        return max(dev_peak, cur)  # the device saw a new high since the reset: it is the peak
    return STATE.mem_peak


def reset_peak() -> None:
    """Start the peak over from the bytes held now."""
    s = _device_stats()
    STATE.mem_peak = 0
    STATE.mem_peak = allocated()
    STATE.mem_device_peak_at_reset = (s or {}).get("peak_bytes_in_use", 0)


def reserved() -> int:
    """Bytes the device allocator holds (its pool where it reports one, else what is allocated)."""
    s = _device_stats()
    if s is not None and "pool_bytes" in s:
        return s["pool_bytes"]
    return allocated()


def max_reserved() -> int:
    """The most bytes the allocator held at once (its pool's peak where reported, else the allocated peak)."""
    s = _device_stats()
    if s is not None and "peak_pool_bytes" in s:
        return s["peak_pool_bytes"]
    return max_allocated()


def stats() -> dict:
    """torch.cuda.memory_stats()'s main keys, plus the platform's own statistics where it reports them."""
    cur, peak = allocated(), max_allocated()
    res, res_peak = reserved(), max_reserved()
    out = {
        "active_bytes.all.current": cur, "active_bytes.all.peak": peak,
        "allocated_bytes.all.current": cur, "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": res, "reserved_bytes.all.peak": res_peak,
        "num_alloc_retries": 0, "num_ooms": STATE.num_ooms,
    }
    out.update(_device_stats() or {})
    return dict(sorted(out.items()))


# ---- out of memory --------------------------------------------------------------------------------------

def _fmt(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.2f} {unit}"
        n /= 1024
    return str(n)


def out_of_memory(message: str) -> torch.OutOfMemoryError:
    """A torch.OutOfMemoryError (a RuntimeError, what OOM handlers catch), counted in `stats()['num_ooms']`."""
    STATE.num_ooms += 1
    return torch.OutOfMemoryError(message)


def translate(e: BaseException) -> BaseException:
    """`e` as torch.OutOfMemoryError when it is JAX's out-of-memory error (RESOURCE_EXHAUSTED), else `e`."""
    if isinstance(e, jax.errors.JaxRuntimeError) and any(m in str(e) for m in _OOM_MARKS):
        err = out_of_memory(f"tpu out of memory: {str(e).splitlines()[0]}")
        err.__cause__ = e
        return err
    return e


def check_alloc(nbytes: int) -> None:
    """Raise torch.OutOfMemoryError now when `nbytes` (a large request) exceeds the device's free memory,
    instead of letting the allocation "succeed" and fail when first used."""
    global CHECK_FROM
    if not CHECK_FROM:
        CHECK_FROM = max(mem_get_info()[1] // 16, 1)
    if nbytes < CHECK_FROM:
        return
    free, total = mem_get_info()
    if nbytes > free:
        raise out_of_memory(f"tpu out of memory. Tried to allocate {_fmt(nbytes)}. tpu:0 has a total capacity "
                            f"of {_fmt(total)} of which {_fmt(free)} is free.")
