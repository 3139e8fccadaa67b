"""`torch.tpu.profiler`: `TpuProfilerConfig`, the settings `tputool.profile.capture(..., config=)` accepts
(trace directory, Python/host tracers, torch.profiler's CPU trace, Perfetto output)."""

from __future__ import annotations

from tputool.profile.config import TpuProfilerConfig

__all__ = ["TpuProfilerConfig"]
