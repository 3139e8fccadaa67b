"""tputool diagnose: run a training script on the tpu backend in a child process and report what slows it.

`diagnose(script, args)` returns a Report of runtime findings (graph breaks, recompiles, host syncs, CPU
fallbacks, float64/float16, MXU padding, fused-eager flushes, host-to-device volume) plus the static findings
of `check` for the same file. Importing this package does not import torch.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tputool.diagnose.model import Finding, Report
from tputool.errors import UserError

if TYPE_CHECKING:
    from tputool.diagnose.record import RunRecord

__all__ = ["Finding", "Report", "diagnose"]


def diagnose(script: str, args: list[str] | None = None, *, timeout_s: float = 600.0, max_steps: int | None = None,
             static_only: bool = False, include_static: bool = True, script_output_to_stderr: bool = False,
             compare_compiled: bool = False) -> Report:
    """Run `script args` under observation (or only analyse it statically) and build the report.

    With `compare_compiled`, an eager training run on tpu is run again for a few steps with its models under
    torch.compile and the measured step times compared (TPU813, `tputool.diagnose.whatif`)."""
    from tputool.diagnose.static import merge, static_findings

    if not os.path.isfile(script):
        raise UserError(f"no such script: {script}")
    if max_steps is not None and max_steps < 1:
        raise UserError("--max-steps must be at least 1")
    if timeout_s <= 0:
        raise UserError("--timeout must be positive")
    static, note = [], None
    if include_static or static_only:
        try:
            static = static_findings(script)
        except ModuleNotFoundError as e:  # check's Python rules not installed in this build
            if not (e.name or "").startswith("tputool."):
                raise
            note = f"static analysis unavailable ({e.name} is missing)"
    if static_only:
        return Report(os.path.abspath(script), "static", 0, 0, None, static, static_only=True, note=note)

    from tputool.diagnose import cost
    from tputool.diagnose.analyze import (
        findings_from_record,
        first_step_compiles,
        steady_launches,
        steady_step_s,
    )
    from tputool.diagnose.runner import run_child

    rec = run_child(script, list(args or []), timeout_s, max_steps, script_output_to_stderr)
    runtime = findings_from_record(rec)
    if compare_compiled and _comparable(rec):
        from tputool.diagnose.whatif import COMPARE_STEPS

        compiled = run_child(script, list(args or []), timeout_s, min(rec.steps, COMPARE_STEPS), compile_models=True,
                             quiet=True)
        f = cost.compiled_step(rec, compiled)
        if f is not None:
            runtime.append(f)
    cost.attach(runtime, rec)
    findings = merge(runtime, static)
    return Report(rec.script, rec.status, int(rec.exit_code or 0), int(rec.steps or 0), round(rec.wall_s, 3), findings,
                  rec.error, _round(rec.run_s, 3), rec.devices, note=note, step_s=_round(steady_step_s(rec), 6),
                  stopped_at=tuple(rec.stopped_at) if rec.stopped_at else None, signal=rec.signal,
                  loop=rec.loop, calls=int(rec.calls or 0), first_compiles=first_step_compiles(rec),
                  launches=steady_launches(rec))


def _comparable(rec: RunRecord) -> bool:
    """An eager training run on tpu that ended well with a steady state: worth timing compiled."""
    from tputool.diagnose.whatif import MIN_STEPS

    return (rec.status in ("ok", "step_limit") and rec.loop == "steps" and rec.steps >= MIN_STEPS
            and "tpu" in rec.devices and not rec.compiles)


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)
