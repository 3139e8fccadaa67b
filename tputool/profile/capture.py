"""Capture a profiler trace of a few steps of a function: JAX's xplane + Perfetto trace, optionally torch's."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tputool.profile.reader import TraceSummary, read_trace

STEP_NAME = "train"


def capture(fn: Callable[[int], Any], steps: int, outdir: str | Path, *, torch_trace: bool = False,
            python_tracer: bool = True, top: int = 10) -> TraceSummary:
    """Run `fn(step)` `steps` times inside `jax.profiler.trace(outdir)`, one StepTraceAnnotation per step.

    Each step's result is blocked on, so a step's span covers its device work. A step that compiles is
    reported as compile time and left out of the step times. With `torch_trace`, torch.profiler also
    records the Python/eager side and writes `outdir/torch_trace.json` (Chrome trace format).
    `python_tracer=False` leaves Python frames out of the trace (much less overhead; steps, compiles and
    XLA ops are still recorded).
    """
    import jax

    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    prof = None
    if torch_trace:
        import torch.profiler

        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.__enter__()
    try:
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 1 if python_tracer else 0
        with jax.profiler.trace(str(out), create_perfetto_trace=True, profiler_options=options):
            for i in range(steps):
                with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=i):
                    jax.block_until_ready(fn(i))
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)
            prof.export_chrome_trace(str(out / "torch_trace.json"))
    return read_trace(out, top=top)
