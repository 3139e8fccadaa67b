"""Calibrate a `Hardware` for the devices at hand (CPU), so the cost model can rank measured candidates.

Simulated CPU devices share the host's cores, so per-device rates are the host's divided by the device
count. These numbers describe this host, not a TPU: results built on them are labelled CPU measurements.
"""

from __future__ import annotations

import os
import time

from tputool.mesh import build_mesh
from tputool.tune.hardware import Hardware


def _best_time(fn, *args, repeats: int = 5) -> float:
    import jax

    jax.block_until_ready(fn(*args))
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        best = min(best, time.perf_counter() - t0)
    return best


def calibrate_host(devices: list | None = None, memory_bytes: float | None = None) -> Hardware:
    """Measure matmul FLOP/s (bf16, fp32), memory bandwidth, dispatch and all-reduce latency here."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices() if devices is None else devices
    n = len(devices)
    size = 512
    rates = {}
    for prec, dt in (("bf16", jnp.bfloat16), ("fp32", jnp.float32)):
        a = jnp.ones((size, size), dt)
        f = jax.jit(lambda x: x @ x)
        rates[prec] = 2 * size**3 / _best_time(f, a) / n
    big = jnp.ones((4 * 1024 * 1024,), jnp.float32)
    bw = 2 * big.nbytes / _best_time(jax.jit(lambda x: x * 2.0 + 1.0), big) / n
    mesh = build_mesh((n,), ("d",), devices, topology=False)
    x = jax.device_put(jnp.ones((n, 256)), NamedSharding(mesh, P("d")))
    trivial = _best_time(jax.jit(lambda v: v + 1.0), x)
    reduce = _best_time(jax.jit(lambda v: v.sum(0, keepdims=True), out_shardings=NamedSharding(mesh, P())), x)
    if memory_bytes is None:
        try:
            memory_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2
        except (ValueError, OSError):
            memory_bytes = 8 * 1024**3
    return Hardware(
        name=f"cpu x{n}", n_devices=n, matmul_flops=rates, hbm_bytes=memory_bytes / n, hbm_bw=bw,
        link_bw=bw, collective_latency_s=max(reduce - trivial, 1e-6), step_overhead_s=trivial, mxu=1, kind="cpu",
    )
