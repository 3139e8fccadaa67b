"""Compile and time one built step: compile time, memory analysis, HLO FLOPs, and a profiled run."""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from tputool.models.spec import ModelSpec
from tputool.profile.capture import capture
from tputool.tune.cost_model import hlo_flops
from tputool.tune.step import BuiltStep
from tputool.tune.xla_log import XlaLog


@dataclass(frozen=True)
class Measurement:
    """What running a candidate showed (times in seconds, bytes per device)."""

    step_s: float  # fastest profiled step (robust to other load on a shared host)
    step_median_s: float
    compute_s: float  # per device per step, from the trace
    collective_s: float
    idle_s: float
    compile_s: float
    temp_bytes: int  # XLA's memory_analysis of the compiled step
    argument_bytes: int
    hlo_flops: float | None  # per device, cost_analysis (while bodies counted once)
    loss: float

    def to_dict(self) -> dict:
        """Plain data."""
        return asdict(self)


def compile_step(built: BuiltStep, log: XlaLog | None = None, who: str = ""):
    """Lower and compile (XLA's warnings filed in `log` under `who`, when given); returns (compiled, seconds)."""
    t0 = time.perf_counter()
    with log.capture(who) if log is not None else contextlib.nullcontext():
        compiled = built.lower().compile()
    return compiled, time.perf_counter() - t0


def memory_bytes(compiled) -> tuple[int, int]:
    """(temp, argument) bytes per device from XLA's memory analysis, zeros when unavailable."""
    try:
        ma = compiled.memory_analysis()
        return int(ma.temp_size_in_bytes), int(ma.argument_size_in_bytes)
    except Exception:  # noqa: BLE001 - not every backend reports it
        return 0, 0


def warm_step(built: BuiltStep, spec: ModelSpec, config: Any, log: XlaLog | None = None,
              who: str = "") -> tuple[Callable[[int], Any], Any, float]:
    """Compile `built` (warnings to `log`), put its arguments on the devices and run one warm-up step.

    Returns (one, compiled, compile seconds): `one(i)` runs one more training step and returns its loss.
    """
    import jax

    compiled, compile_s = compile_step(built, log, who)
    state, inputs, targets = built.init_args(spec, config)
    holder = {"s": state}

    def one(_i: int):
        holder["s"], loss = compiled(holder["s"], inputs, targets)
        return loss

    jax.block_until_ready(one(0))
    return one, compiled, compile_s


def measure(built: BuiltStep, spec: ModelSpec, config: Any, steps: int = 3,
            trace_dir: str | None = None, log: XlaLog | None = None, who: str = "") -> Measurement:
    """Compile (XLA's warnings to `log` under `who`), run one warm-up step, then profile `steps` steps and
    read the trace."""
    one, compiled, compile_s = warm_step(built, spec, config, log, who)
    with tempfile.TemporaryDirectory(prefix="tputool-tune-") as tmp:
        summary = capture(one, steps, trace_dir or tmp, python_tracer=False)
    loss = float(one(0))
    temp, args = memory_bytes(compiled)
    return Measurement(
        step_s=min(summary.step_times_s), step_median_s=summary.step_time_s, compute_s=summary.compute_s, collective_s=summary.collective_s,
        idle_s=summary.idle_s, compile_s=compile_s, temp_bytes=temp, argument_bytes=args,
        hlo_flops=hlo_flops(compiled), loss=loss,
    )
