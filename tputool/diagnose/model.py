"""The diagnose report's data: findings (runtime and static) and the report around them."""

from __future__ import annotations

from dataclasses import dataclass, field

from tputool.rules.model import Finding, Severity  # noqa: F401 - Finding: the one finding type, re-exported


@dataclass
class Report:
    """Everything one diagnose run found, plus the run's facts (status, steps, time, trimmed traceback)."""

    script: str
    status: str  # ok | error | exited | step_limit | timeout | interrupted | crashed | static
    exit_code: int  # the script's own status (tputool.diagnose.exits maps the run to diagnose's)
    steps: int
    wall_s: float | None
    findings: list[Finding]
    error: dict | None = None
    run_s: float | None = None
    devices: list[str] = field(default_factory=list)
    static_only: bool = False
    note: str | None = None  # e.g. why the static analysis was skipped
    step_s: float | None = None  # median seconds per iteration (step, or call), second half of the run
    stopped_at: tuple[str, int] | None = None  # the last user line seen at --timeout or an interrupt
    signal: str | None = None  # the signal that killed the script (SIGSEGV), if one did
    loop: str | None = None  # "steps" (optimizer steps), "calls" (top-level model calls: inference), or None
    calls: int = 0  # top-level model calls, when no optimizer step ran
    first_compiles: int | None = None  # XLA compiles before the first iteration ended (tpu runs)
    launches: int | None = None  # device programs launched per steady-state iteration (tpu runs)

    @property
    def script_failed(self) -> bool:
        """True when the user's script raised, exited non-zero or crashed the child."""
        return self.status in ("error", "exited", "crashed")

    def problems(self, at_least: Severity = Severity.WARNING) -> list[Finding]:
        """The findings to act on, at `at_least` or worse: runtime ones for a run (static ones for --static),
        not the script's failure or the timeout itself."""
        return [f for f in self.findings if f.severity >= at_least and f.code not in ("TPU810", "TPU811")
                and (self.static_only or f.source == "runtime")]

    def static_unseen(self) -> list[Finding]:
        """Static findings of a run that no runtime observation confirmed (listed apart, not counted)."""
        return [] if self.static_only else [f for f in self.findings if f.source == "static"]

    def counts(self) -> dict[str, int]:
        """Number of findings per severity name (error, warning, info)."""
        out = {str(s): 0 for s in (Severity.ERROR, Severity.WARNING, Severity.INFO)}
        for f in self.findings:
            out[str(f.severity)] += 1
        return out
