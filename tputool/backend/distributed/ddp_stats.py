"""DDP's sampled runtime statistics for modules on the tpu device.

DDP's C++ logger samples runtime statistics (step times, unused parameter bytes, rebuilt buckets) in its
forward, and times the step with a device timer from a C++ registry that holds only CPU and CUDA timers; for any
other device it prints "Time stats are currently only collected for CPU and CUDA devices" to stderr (a C++
warning, out of reach of Python's warning filters) the first time it samples. A tpu module has no timer there,
so its DDP does not sample them: `torch.distributed.Reducer` and `.Logger` (the names DDP builds them by) become
the subclasses below, which skip the sampling for tpu parameters only. CPU and CUDA modules run torch's code.
"""

from __future__ import annotations

import torch.distributed as dist

_TorchReducer = dist.Reducer
_TorchLogger = dist.Logger


class Reducer(_TorchReducer):
    """torch's DDP reducer, remembering whether its parameters are tpu tensors (`on_tpu`)."""

    def __init__(self, params, *args, **kwargs) -> None:
        super().__init__(params, *args, **kwargs)
        self.on_tpu = bool(params) and params[0].device.type == "tpu"


class Logger(_TorchLogger):
    """torch's DDP logger; the runtime statistics are sampled unless the reducer's parameters are on tpu."""

    def __init__(self, reducer) -> None:
        super().__init__(reducer)
        self.samples = not getattr(reducer, "on_tpu", False)

    def set_runtime_stats_and_log(self) -> None:
        """torch's sampling of the step's statistics, except for a tpu module (no device timer: see module)."""
        if self.samples:
            super().set_runtime_stats_and_log()


def install() -> None:
    """Make DDP build its reducer and logger from the classes above (idempotent)."""
    dist.Reducer, dist.Logger = Reducer, Logger
