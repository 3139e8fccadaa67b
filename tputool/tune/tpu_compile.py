"""Compile a candidate for a real TPU topology without a TPU (optional `libtpu` wheel, extra `tpu-compile`).

`jax.experimental.topologies.get_topology_desc` gives compile-only TPU devices; compiling the sharded
step for them yields TPU memory analysis and real out-of-memory errors.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from tputool.tune.candidate import Candidate
from tputool.tune.hardware import Hardware
from tputool.tune.xla_log import XlaLog


def available() -> bool:
    """True when the libtpu wheel is importable."""
    return importlib.util.find_spec("libtpu") is not None


HOST_CHIPS = 4
"""Chips of one TPU host (2x2x1): a topology with fewer chips is one host of exactly that shape."""


def topology_devices(topology_name: str) -> list:
    """Compile-only devices of a TPU topology such as `v5e:2x4` (or `v5e:1x1`, less than a host)."""
    import math
    import os

    from jax.experimental import topologies

    # compile-only: no TPU is opened, so other processes compiling for a topology (a test, a tune run) may
    # hold libtpu too (otherwise the second one fails on /tmp/libtpu_lockfile)
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

    dims = [int(d) for d in topology_name.split(":")[1].split("x")]
    extra = {}
    if math.prod(dims) < HOST_CHIPS:
        extra["chips_per_host_bounds"] = [*dims, 1, 1][:3]
    return list(topologies.get_topology_desc(topology_name=topology_name, platform="tpu", **extra).devices)


def compiled_bytes(compiled) -> float:
    """Peak bytes per device XLA reports: arguments + outputs + temporaries - aliased."""
    ma = compiled.memory_analysis()
    return float(ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
                 - ma.alias_size_in_bytes)


def compile_checker(rm, hw: Hardware, log: XlaLog | None = None) -> Callable[[Candidate], float]:
    """A function compiling a candidate of `rm` for `hw`'s topology, returning bytes/device (raises on OOM);
    XLA's warnings go to `log` (one summary line per kind) instead of the terminal."""
    from tputool.backend.graph.attention_kernels import for_tpu_target
    from tputool.tune.step import build_step

    if hw.slice is None:
        raise ValueError("compile checks need a TPU slice")
    log = log if log is not None else XlaLog()
    with log.capture(f"topology {hw.slice.topology_name}"):  # (libtpu's start-up warnings)
        devices = topology_devices(hw.slice.topology_name)

    def check(c: Candidate) -> float:
        with log.capture(c.key), for_tpu_target():
            built = build_step(rm.spec, rm.config, c, devices=devices, materialize=False, scan_layers=True)
            return compiled_bytes(built.lower().compile())

    return check
