"""What each runtime finding costs per step, in milliseconds, so the report can rank them.

A cost is "measured" when the run timed it: the compiled-step comparison (eager step time minus the step time
of a short run with the models under torch.compile, `tputool.diagnose.whatif`) and steady-state XLA compiles
(the compile seconds of the run's second half over its steps). Otherwise it is "estimated": the finding's
events per step times the typical price of one such event on a TPU host (`ESTIMATED_MS`), which the run cannot
time because removing the event is what would show its price. Findings with no time cost (MXU padding,
float64 use) get none and rank after the others.
"""

from __future__ import annotations

from tputool.diagnose.analyze import _finding, steady_step_s
from tputool.diagnose.model import Finding
from tputool.diagnose.record import RunRecord
from tputool.rules.model import Severity

ESTIMATED_MS: dict[str, float] = {
    "TPU601": 0.1,  # a host sync: the device-to-host round trip, and the host stops queueing the next step
    "TPU602": 0.1,  # a data-dependent shape: a host sync to learn the size
    "TPU809": 0.1,  # a one-off or periodic sync: the same price, spread over the steps
    "TPU803": 0.5,  # a CPU fallback: copies both ways and the op on the host
    "TPU806": 0.05,  # a fused-eager flush: one more program launch
    "TPU801": 0.2,  # a graph break: one more launch and the values crossing it through the host
}
"""Typical milliseconds one event of the finding costs on a TPU host (estimates, not measurements)."""
H2D_MS_PER_MIB = 0.1
"""Host-to-device copies: about 10 GiB/s."""
COMPILE_WARN_FRACTION = 0.25
"""The compiled step is a warning when it saves at least this fraction of the eager step."""
COMPILE_NOTE_FRACTION = 0.05
"""Below this saving the comparison is only a note (torch.compile measured no faster)."""


def _set(f: Finding, ms: float, basis: str) -> None:
    # a new dict, not written into: findings may share one `extra` (port's do, codemods/python/context.py)
    f.extra = {**f.extra, "cost_ms": round(ms, 4), "cost_basis": basis}


def attach(findings: list[Finding], rec: RunRecord) -> None:
    """Set `extra["cost_ms"]` (per step) and `extra["cost_basis"]` ("measured"/"estimated") where known."""
    steps = int(rec.steps or 0) or int(rec.calls or 0)
    steady = steps - steps // 2
    recompiles = [f for f in findings if f.source == "runtime" and f.code in ("TPU802", "TPU808")
                  and f.severity >= Severity.WARNING]
    late_s = float(rec.xla.get("late_compile_s") or 0.0)
    total = sum(f.count for f in recompiles)
    for f in findings:
        if f.source != "runtime" or "cost_ms" in f.extra:
            continue
        if f in recompiles and steady and total:
            _set(f, 1000 * late_s / steady * f.count / total, "measured")
        elif f.code == "TPU807" and f.per_step is not None and steady:
            mib = f.extra.get("bytes", 0) / 2**20 / max(steps, 1)
            _set(f, mib * H2D_MS_PER_MIB, "estimated")
        elif f.code in ESTIMATED_MS and f.per_step is not None:
            _set(f, f.per_step * ESTIMATED_MS[f.code], "estimated")


def compiled_step(rec: RunRecord, compiled: RunRecord) -> Finding | None:
    """TPU813 from the eager run and the run with its models compiled: the measured step times, or None when
    the compiled run gives no comparison (it failed, compiled nothing, or has no steady state)."""
    eager, comp = steady_step_s(rec), steady_step_s(compiled)
    if (eager is None or comp is None or compiled.status not in ("ok", "step_limit") or not compiled.compiled_models
            or compiled.steps < 2):
        return None
    saving = eager - comp
    first = compiled.compiled_models[0]
    names = ", ".join(dict.fromkeys(m["cls"] for m in compiled.compiled_models))
    figure = f"~{_ms(eager)} -> ~{_ms(comp)} ms per step"
    if saving >= COMPILE_NOTE_FRACTION * eager:
        severity = Severity.WARNING if saving >= COMPILE_WARN_FRACTION * eager else Severity.INFO
        msg = f"run the step under torch.compile: {figure} (measured, {names} compiled)"
        fix = (f"compile the model once it is built: `model = torch.compile(model, backend=\"tpu\")` ({names}, "
               "called here); the optimizer step can stay as it is")
    else:
        severity = Severity.INFO
        msg = f"under torch.compile the step took ~{_ms(comp)} ms, eager ~{_ms(eager)} ms: no gain measured"
        fix = "nothing to gain here from torch.compile"
    f = _finding("TPU813", first["file"], first["line"], msg, severity=severity, fix=fix,
                 eager_ms=round(1000 * eager, 3), compiled_ms=round(1000 * comp, 3), models=names,
                 compared_steps=compiled.steps)
    _set(f, max(1000 * saving, 0.0), "measured")
    return f


def _ms(s: float) -> str:
    ms = 1000 * s
    return f"{ms:.0f}" if ms >= 10 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2g}"


def figure(f: Finding, unit: str = "step") -> str | None:
    """The finding's cost per step (or per `unit`: "call" for a loop of model calls) in words ("~0.4 ms/step,
    estimated"), or None when it has none."""
    ms = f.extra.get("cost_ms")
    if ms is None:
        return None
    if f.code == "TPU813":
        return f"~{_ms(f.extra['eager_ms'] / 1000)} -> ~{_ms(f.extra['compiled_ms'] / 1000)} ms per {unit}, measured"
    return f"~{_ms(ms / 1000)} ms/{unit}, {f.extra['cost_basis']}"


def rank_key(f: Finding) -> float:
    """Sort key: the most costly per step first; findings without a cost after every costed one."""
    ms = f.extra.get("cost_ms")
    return -ms if ms is not None else 1.0
