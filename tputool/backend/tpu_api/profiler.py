"""`torch.tpu.profiler`: `TpuProfilerConfig`, the settings `tputool.profile.capture(..., config=)` accepts
(trace directory, Python/host tracers, torch.profiler's CPU trace, Perfetto output). Loaded on first access,
so `import torch` does not import tputool.profile."""

from __future__ import annotations

from typing import Any

__all__ = ["TpuProfilerConfig"]  # noqa: F822 - loaded by __getattr__


def __getattr__(name: str) -> Any:
    if name == "TpuProfilerConfig":
        from tputool.profile.config import TpuProfilerConfig

        globals()[name] = TpuProfilerConfig
        return TpuProfilerConfig
    raise AttributeError(f"module 'torch.tpu.profiler' has no attribute {name!r}")
