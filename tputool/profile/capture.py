"""Capture a profiler trace of a few steps of a function: JAX's xplane + Perfetto trace, optionally torch's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tputool.errors import UserError
from tputool.profile.config import TpuProfilerConfig
from tputool.profile.reader import TraceSummary, read_trace

STEP_NAME = "train"


def capture(fn: Callable[[int], Any], steps: int, outdir: str | Path | None = None, *, torch_trace: bool = False,
            python_tracer: bool = True, top: int = 10, config: TpuProfilerConfig | None = None) -> TraceSummary:
    """Run `fn(step)` `steps` times inside `jax.profiler.trace(outdir)`, one StepTraceAnnotation per step.

    Each step's result is blocked on, so a step's span covers its device work. A step that compiles is
    reported as compile time and left out of the step times. With `torch_trace`, torch.profiler also
    records the Python/eager side and writes `outdir/torch_trace.json` (Chrome trace format).
    `python_tracer=False` leaves Python frames out of the trace (much less overhead; steps, compiles and
    XLA ops are still recorded). A `config` (torch.tpu.profiler.TpuProfilerConfig) gives all these settings
    instead of the keywords, and the directory when `outdir` is None.
    """
    if config is None:
        config = TpuProfilerConfig(torch_trace=torch_trace, python_tracer=python_tracer)
    outdir = outdir if outdir is not None else config.log_dir
    if outdir is None:
        raise UserError("capture: no trace directory (give outdir or a TpuProfilerConfig with log_dir)")
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    prof = None
    if config.torch_trace:
        import torch.profiler

        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.__enter__()
    try:
        import jax

        with jax.profiler.trace(str(out), create_perfetto_trace=config.create_perfetto_trace,
                                profiler_options=config.profile_options()):
            for i in range(steps):
                with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=i):
                    jax.block_until_ready(fn(i))
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(str(out / "torch_trace.json"))
    return read_trace(out, top=top)
