"""`tputool tune --calibrate TRACE_DIR`: refit the cost model's achievable fractions from a profiler trace of
a real run (our `tputool profile` output, or an XProf/TensorBoard trace: `.xplane.pb`, else
`*.trace.json.gz`), and say how far the model's prediction was from what the trace shows.

The trace's per-device op time is split by op class (profile/categories.op_class: matmul, attention,
HBM-bound elementwise, collectives); each fraction is rescaled so the model's time for that class equals
the trace's; the time no op covers becomes the fixed per-step cost, and the overlap cost is set so the
exposed collectives match. Fusion names decide the class, so a TPU fusion that hides a dot counts as
elementwise: the matmul fraction is then a lower bound and the HBM one an upper bound.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path

from tputool.errors import UserError
from tputool.profile.categories import op_class
from tputool.profile.reader import TraceSummary, read_any_trace, read_json_trace
from tputool.tune.candidate import Candidate, ModelDims
from tputool.tune.cost_model import Estimate, estimate
from tputool.tune.efficiency import Efficiency
from tputool.tune.hardware import Hardware

CLASSES = ("matmul", "attention", "elementwise", "collective")


@dataclass(frozen=True)
class TraceTimes:
    """Per device per step, seconds, from a trace."""

    step: float
    by_class: dict[str, float]
    idle: float

    @classmethod
    def from_summary(cls, s: TraceSummary) -> TraceTimes:
        """Sum the summary's ops (read with no top limit) by op class.

        The step is the mean of the measured steps, as the ops' and the idle time are: one slow step (a loaded
        host) moves all three alike, where a median step would leave the parts summing to more than the whole.
        """
        by = dict.fromkeys(CLASSES, 0.0)
        for op in s.top_ops:
            by[op_class(op.name)] += op.time_s
        step = statistics.fmean(s.step_times_s) if s.step_times_s else float("nan")
        return cls(step=step, by_class=by, idle=s.idle_s)


@dataclass(frozen=True)
class Calibration:
    """What the model said before, what the trace shows, and the refit fractions."""

    before: Estimate
    after: Estimate
    measured: TraceTimes
    efficiency: Efficiency

    def lines(self) -> list[str]:
        """A small report: per class predicted vs traced, then the step before and after."""
        b, m = self.before, self.measured
        pred = {"matmul": b.terms["matmul"], "attention": b.terms["attention"],
                "elementwise": b.terms["hbm-bound ops"] + b.terms["optimizer"], "collective": b.comm_s}
        out = [f"{'op class':12s} {'predicted':>12s} {'trace':>12s}   (per device per step)"]
        for k in CLASSES:
            out.append(f"{k:12s} {pred[k] * 1e3:10.3f} ms {m.by_class[k] * 1e3:10.3f} ms")
        out.append(f"{'idle':12s} {b.terms['fixed'] * 1e3:10.3f} ms {m.idle * 1e3:10.3f} ms")
        out.append(f"step: the model predicted {b.step_s * 1e3:.3f} ms, the trace shows {m.step * 1e3:.3f} ms (mean) "
                   f"(predicted/trace = {b.step_s / m.step:.2f}); refit model: {self.after.step_s * 1e3:.3f} ms "
                   f"({self.after.step_s / m.step:.2f})")
        e = self.efficiency
        out.append("refit fractions: " + ", ".join(f"{k}={v:.3g}" for k, v in e.to_dict().items()))
        return out


def _scaled(frac: float, predicted: float, measured: float) -> float:
    """A fraction rescaled so a time proportional to 1/fraction moves from `predicted` to `measured`."""
    return frac * predicted / measured if predicted > 0 and measured > 0 else frac


def _refit(dims: ModelDims, candidate: Candidate, hw: Hardware, trace: TraceTimes, e: Efficiency) -> Efficiency:
    """One rescaling step of the per-class fractions towards the trace."""
    t = estimate(dims, candidate, dataclasses.replace(hw, eff=e)).terms
    m = trace.by_class
    if m["attention"] > 0:
        matmul = _scaled(e.matmul, t["matmul"], m["matmul"])
        attention = _scaled(e.attention, t["attention"], m["attention"])
    else:  # attention ran as plain dots: fold it into the matmul class
        matmul = _scaled(e.matmul, t["matmul"] + t["attention"], m["matmul"])
        attention = e.attention * matmul / e.matmul
    hbm = _scaled(e.hbm, t["hbm-bound ops"] + t["optimizer"], m["elementwise"])
    ici = _scaled(e.ici, estimate(dims, candidate, dataclasses.replace(hw, eff=e)).comm_s, m["collective"])
    return dataclasses.replace(e, matmul=matmul, attention=attention, hbm=hbm, ici=ici)


def calibrate(dims: ModelDims, candidate: Candidate, hw: Hardware, trace: TraceTimes,
              rounds: int = 4) -> Calibration:
    """Refit `hw`'s fractions so the model reproduces `trace` for `candidate` of `dims`.

    A few rescaling rounds: classes interact (a matmul streaming its weights is priced at HBM speed).
    """
    before = estimate(dims, candidate, hw)
    eff = dataclasses.replace(hw.eff, overlap_cost=0.0, step_fixed_s=max(trace.idle, 0.0))
    for _ in range(rounds):
        eff = _refit(dims, candidate, hw, trace, eff)
    bare = estimate(dims, candidate, dataclasses.replace(hw, eff=eff, step_overhead_s=eff.step_fixed_s))
    busy = sum(trace.by_class[k] for k in ("matmul", "attention", "elementwise"))
    exposed_meas = max(0.0, trace.step - trace.idle - busy)
    hidden = bare.comm_s - bare.comm_exposed_s
    overlap = min(max((exposed_meas - bare.comm_exposed_s) / hidden, 0.0), 1.0) if hidden > 0 else 0.0
    eff = dataclasses.replace(eff, overlap_cost=overlap)
    after = estimate(dims, candidate, dataclasses.replace(hw, eff=eff, step_overhead_s=eff.step_fixed_s))
    return Calibration(before, after, trace, eff)


def calibrate_cmd(trace_dir: str, model: str, overrides: dict, out: str, target: str | None,
                  cpu_devices: int | None, config: str | None = None) -> Calibration:
    """The CLI: read the trace, describe the run (model, candidate, machine), refit, print and write."""
    from rich.console import Console

    from tputool.profile.devices import host_only_jax, use_cpu_devices
    from tputool.tune.efficiency import write_calibration

    if target is None and cpu_devices is None:
        try:  # the JSON trace says how many devices ran without starting JAX (which fixes the count)
            n = read_json_trace(trace_dir).n_devices
            cpu_devices = n if n > 1 else None
        except UserError:
            pass
    if target is None:
        use_cpu_devices(cpu_devices)
    else:
        host_only_jax()
    # tune.api imports torch, which starts JAX: only after the device count is set
    from tputool.tune.api import resolve_model

    summary = read_any_trace(trace_dir, top=10**9)
    rm = resolve_model(model, overrides)
    if config is not None:
        from tputool.tune.config import load_config

        cand = load_config(config).candidate
    else:
        cand = Candidate(data=summary.n_devices, batch=1)  # what `tputool profile --model` runs by default
    if target is not None:
        from tputool.tune.hardware import tpu_hardware

        hw = tpu_hardware(target)
        key = hw.slice.chip.name if hw.slice else "default"
    else:
        import jax

        from tputool.tune.calibrate import calibrate_host

        hw, key = calibrate_host(jax.devices()[: cand.n_devices]), "cpu"
    result = calibrate(rm.dims, cand, hw, TraceTimes.from_summary(summary))
    console = Console(width=160)
    console.print(f"calibrating {rm.dims.name} {cand.key} on {hw.name} from {summary.xplane_path}")
    for line in result.lines():
        console.print(line)
    path = Path(out if out != "tputool-tune.yaml" else "tputool-calibration.yaml")
    write_calibration(path, {key: result.efficiency}, f"tputool tune --calibrate {trace_dir}")
    console.print(f"wrote {path} (use it with: tputool tune --calibration {path} ...)")
    return result
