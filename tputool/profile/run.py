"""`tputool profile`: trace a built-in/user model's training step, or a whole Python script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tputool.errors import UserError
from tputool.profile.reader import TraceSummary, read_trace
from tputool.scripts import run_as_main, script_path


def profile_model(model: str, steps: int, outdir: str | Path, candidate: Any = None,
                  overrides: dict[str, Any] | None = None) -> TraceSummary:
    """Trace `steps` training steps of `model` (data-parallel over all devices unless `candidate` is given)."""
    import jax

    from tputool.profile.capture import capture
    from tputool.tune.api import resolve_model
    from tputool.tune.candidate import Candidate
    from tputool.tune.measure import compile_step
    from tputool.tune.step import build_step

    if steps < 1:
        raise UserError(f"--steps must be >= 1, got {steps}")
    rm = resolve_model(model, overrides)
    c = candidate or Candidate(data=jax.device_count(), batch=1)
    built = build_step(rm.spec, rm.config, c)
    compiled, _ = compile_step(built)
    state, inputs, targets = built.init_args(rm.spec, rm.config)
    holder = {"s": state}

    def one(_i: int):
        holder["s"], loss = compiled(holder["s"], inputs, targets)
        return loss

    jax.block_until_ready(one(0))
    return capture(one, steps, outdir)


def profile_script(script: str | Path, args: list[str], outdir: str | Path) -> TraceSummary:
    """Run `script` as __main__ under jax.profiler and torch.profiler; each executable run is one step."""
    import jax
    import torch.profiler

    path = script_path(script)
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with prof, jax.profiler.trace(str(out), create_perfetto_trace=True):
        run_as_main(path, args)
    prof.export_chrome_trace(str(out / "torch_trace.json"))
    return read_trace(out)
