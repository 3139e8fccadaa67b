"""tputool.profile: capture JAX profiler traces and summarise them (`capture`, `read_trace`; `TpuProfilerConfig`)."""

from tputool.profile.capture import capture
from tputool.profile.config import TpuProfilerConfig
from tputool.profile.reader import OpStat, TraceSummary, read_trace

__all__ = ["OpStat", "TpuProfilerConfig", "TraceSummary", "capture", "read_trace"]
