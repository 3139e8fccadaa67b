"""The diagnose child's record: what one observed run of a script showed, as raw observations.

`tputool.diagnose._child` fills a `RunRecord` and writes `to_dict()` as JSON; the parent
(`tputool.diagnose.runner`) reads it back with `from_dict`, and `tputool.diagnose.analyze` turns it into
findings. The list fields hold plain dicts (JSON-ready data), one per aggregated observation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STATUSES = ("ok", "error", "exited", "step_limit", "timeout", "interrupted", "crashed")
"""How a run ended: normally, with an exception, with a non-zero SystemExit, at --max-steps, at --timeout,
interrupted (Ctrl-C / KeyboardInterrupt), or with the child lost (killed by a signal, os._exit)."""


@dataclass
class RunRecord:
    """One observed run. Fields the child could not fill (a crashed child) keep their empty defaults."""

    script: str  # absolute path
    argv: list[str]
    status: str  # one of STATUSES
    exit_code: int | None = 0  # the script's own status: SystemExit's code, 1 for an exception, 128+N for signal N
    signal: str | None = None  # the signal's name (SIGSEGV) when the child was killed by one
    stopped_at: list | None = None  # [file, line]: the last user line seen at --timeout or an interrupt
    max_steps: int | None = None
    timeout_s: float | None = None
    error: dict[str, Any] | None = None  # {type, message, traceback: [{file, line, function, text}]}
    note: str | None = None  # e.g. the script left a TorchFunctionMode active
    steps: int = 0  # optimizer steps seen
    loop: str | None = None  # what an iteration was: "steps" (optimizer steps), "calls" (model calls), or None
    calls: int = 0  # top-level model calls, counted when no optimizer step ran (inference, eval, generate)
    call_sites: list[dict[str, Any]] = field(default_factory=list)  # tputool.diagnose.calls.CallCounter.to_record
    run_s: float | None = None  # the script's run, startup excluded
    startup_s: float | None = None
    step_s: list[float] = field(default_factory=list)  # seconds of each iteration (step or call)
    xla: dict[str, Any] = field(default_factory=dict)  # jaxwatch totals: compiles, compile_s, late_* ...
    # from the function mode (tputool.diagnose.observe)
    host_syncs: list[dict[str, Any]] = field(default_factory=list)  # kind, file, line, device, direct, count, steps_seen
    dtypes: list[dict[str, Any]] = field(default_factory=list)  # dtype, op, file, line, count
    dynamic_shapes: list[dict[str, Any]] = field(default_factory=list)  # op, file, line, count
    shapes: list[dict[str, Any]] = field(default_factory=list)  # op, file, line, dims, count
    devices: list[str] = field(default_factory=list)
    # from Dynamo (tputool.diagnose.dynamo)
    graph_breaks: list[dict[str, Any]] = field(default_factory=list)
    compiles: list[dict[str, Any]] = field(default_factory=list)
    recompile_limit: int | None = None
    # from the backend's event log (tputool.backend.events)
    events: list[dict[str, Any]] = field(default_factory=list)  # kind, detail, file, line, count, amount, late ...
    event_totals: dict[str, int] = field(default_factory=dict)
    launches: list[int] | None = None  # device programs launched in each iteration (as step_s); None: no backend
    wall_s: float | None = None  # set by the parent: the child's wall time
    compiled_models: list[dict[str, Any]] = field(default_factory=list)  # --compile-models: cls, file, line

    def to_dict(self) -> dict[str, Any]:
        """Plain data (the JSON the child writes)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """The record of `to_dict()`'s data; absent fields take their defaults, unknown keys are a TypeError."""
        return cls(**data)
