"""`tputool profile SCRIPT`: trace a whole Python script (`tputool profile --model` is `tputool.tune.api.profile_model`:
a model's training step is built by tune, which uses this package, never the reverse)."""

from __future__ import annotations

from pathlib import Path

from tputool.profile.reader import TraceSummary, read_trace
from tputool.scripts import run_as_main, script_path


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
