"""`TpuProfilerConfig` (torch.tpu.profiler's name): how `tputool.profile.capture` records a trace."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TpuProfilerConfig:
    """Profiler settings: where the trace goes and which tracers run.

    `log_dir`: the trace directory (capture's `outdir` when that is not given); `python_tracer`: record
    Python frames (costly); `host_tracer_level`: 0 off, 1 user annotations, 2 (default) + high-level runtime
    events, 3 + everything; `torch_trace`: also torch.profiler's CPU trace (`torch_trace.json`);
    `create_perfetto_trace`: also write a Perfetto trace file."""

    log_dir: str | None = None
    python_tracer: bool = True
    host_tracer_level: int = 2
    torch_trace: bool = False
    create_perfetto_trace: bool = True

    def __post_init__(self) -> None:
        if self.host_tracer_level not in (0, 1, 2, 3):
            raise ValueError(f"host_tracer_level must be 0, 1, 2 or 3, got {self.host_tracer_level!r}")

    def profile_options(self) -> Any:
        """The `jax.profiler.ProfileOptions` of this config."""
        import jax

        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 1 if self.python_tracer else 0
        options.host_tracer_level = self.host_tracer_level
        return options
