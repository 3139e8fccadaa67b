"""tputool.profile: capture JAX profiler traces and summarise them (`capture`, `read_trace`)."""

from tputool.profile.capture import capture
from tputool.profile.reader import OpStat, TraceSummary, read_trace

__all__ = ["OpStat", "TraceSummary", "capture", "read_trace"]
