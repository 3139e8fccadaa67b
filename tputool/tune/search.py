"""The tuner: enumerate, predict with the cost model, reject what cannot fit, measure the best-ranked
fraction (measured mode) or rank by prediction (predicted mode), and explain every rejection."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tputool.tune.candidate import Candidate, ModelDims
from tputool.tune.cost_model import Estimate, estimate
from tputool.tune.hardware import Hardware
from tputool.tune.measure import Measurement
from tputool.tune.rules import partition_specs
from tputool.tune.space import Rejected, SearchSpace, enumerate_space

GIB = 1024**3


@dataclass
class Row:
    """One candidate's fate in a search."""

    candidate: Candidate
    estimate: Estimate
    predicted_rank: int = 0
    status: str = "predicted"  # measured | predicted | pruned | memory | failed
    reason: str = ""
    measurement: Measurement | None = None
    compiled_memory: float | None = None  # bytes/device from a TPU compile (predicted mode)

    @property
    def measured_tokens_per_s(self) -> float | None:
        """Measured throughput of the whole job, if measured."""
        if self.measurement is None:
            return None
        return self.estimate.tokens_per_step / self.measurement.step_s


@dataclass
class TuneResult:
    """Everything a search found: the ranked rows, the exclusions and the winner."""

    model: str
    mode: str  # measured | predicted
    hardware: Hardware
    label: str  # e.g. "CPU measurements (8 simulated devices)" or "estimated for v5e-256"
    rows: list[Row]
    rejected: list[Rejected]
    winner: Row | None
    budget: int = 0  # candidates allowed to run
    notes: list[str] = field(default_factory=list)

    @property
    def measured(self) -> list[Row]:
        """Rows that were run."""
        return [r for r in self.rows if r.status == "measured"]

    def spearman(self) -> float | None:
        """Rank correlation between predicted and measured throughput over the measured rows."""
        rows = self.measured
        if len(rows) < 3:
            return None
        return spearman([r.estimate.tokens_per_s for r in rows], [r.measured_tokens_per_s for r in rows])


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation (Pearson on average ranks, so ties are handled)."""
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else 0.0


def predict_all(dims: ModelDims, hw: Hardware, space: SearchSpace,
                param_shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[list[Row], list[Rejected]]:
    """Every valid candidate with its estimate, ranked by predicted throughput; memory misfits flagged."""
    enum = enumerate_space(dims, hw.n_devices, space)
    rows = []
    for c in enum.candidates:
        local = None
        if param_shapes is not None:
            local = partition_specs(param_shapes, c.mesh).local_elements(param_shapes, c.mesh)
        rows.append(Row(c, estimate(dims, c, hw, params_per_device=local)))
    rows.sort(key=lambda r: -r.estimate.tokens_per_s)
    for i, r in enumerate(rows, 1):
        r.predicted_rank = i
        if not r.estimate.fits:
            r.status = "memory"
            r.reason = (f"predicted {r.estimate.memory.total / GIB:.2f} GiB/device > "
                        f"{r.estimate.hbm_bytes / GIB:.2f} GiB available")
    return rows, enum.rejected


def run_budget(n_candidates: int, fraction: float) -> int:
    """How many candidates may be run: at most `fraction` of them (at least one)."""
    return max(1, int(n_candidates * fraction))


def tune_measured(dims: ModelDims, hw: Hardware, space: SearchSpace,
                  run: Callable[[Candidate], Measurement], fraction: float = 1 / 3,
                  param_shapes: dict[str, tuple[int, ...]] | None = None,
                  progress: Callable[[Row, int, int], None] | None = None, label: str = "") -> TuneResult:
    """Measure the cost model's top `fraction` of the fitting candidates with `run`; the fastest measured wins.

    Candidates predicted not to fit are flagged and never run; the rest beyond the budget are recorded as
    pruned with their predicted rank.
    """
    rows, rejected = predict_all(dims, hw, space, param_shapes)
    budget = run_budget(len(rows), fraction)
    fitting = [r for r in rows if r.status != "memory"]
    to_run, rest = fitting[:budget], fitting[budget:]
    for r in rest:
        r.status = "pruned"
        best = fitting[0].estimate.tokens_per_s
        r.reason = (f"predicted rank {r.predicted_rank}/{len(rows)}: {r.estimate.tokens_per_s:,.0f} tok/s vs "
                    f"best {best:,.0f}; outside the run budget of {budget}")
    for i, r in enumerate(to_run, 1):
        try:
            r.measurement = run(r.candidate)
            r.status = "measured"
        except Exception as e:  # noqa: BLE001 - a failing candidate is a finding, not a crash
            r.status = "failed"
            r.reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]
        if progress is not None:
            progress(r, i, len(to_run))
    measured = [r for r in rows if r.status == "measured"]
    winner = max(measured, key=lambda r: r.measured_tokens_per_s) if measured else None
    return TuneResult(dims.name, "measured", hw, label or f"measured on {hw.name}", rows, rejected, winner,
                      budget)


def tune_predicted(dims: ModelDims, hw: Hardware, space: SearchSpace,
                   param_shapes: dict[str, tuple[int, ...]] | None = None,
                   compile_check: Callable[[Candidate], float] | None = None, top: int = 5,
                   progress: Callable[[Row, int, int], None] | None = None) -> TuneResult:
    """Rank by the cost model; with `compile_check` (a TPU compile returning bytes/device, raising on OOM),
    confirm memory fit of the top `top` fitting candidates and take the best that compiles."""
    rows, rejected = predict_all(dims, hw, space, param_shapes)
    fitting = [r for r in rows if r.status != "memory"]
    label = f"estimated for {hw.name}"
    winner = fitting[0] if fitting else None
    if compile_check is not None:
        label = f"cost model ranked, memory checked by compiling for {hw.slice.topology_name if hw.slice else hw.name}"
        winner = None
        checked = fitting[:top]
        for i, r in enumerate(checked, 1):
            try:
                r.compiled_memory = compile_check(r.candidate)
                if r.compiled_memory > hw.hbm_bytes:
                    r.status, r.reason = "memory", f"compiled {r.compiled_memory / GIB:.2f} GiB/device > HBM"
                elif winner is None:
                    winner = r
            except Exception as e:  # noqa: BLE001 - RESOURCE_EXHAUSTED and other compile failures
                r.status = "memory" if "RESOURCE_EXHAUSTED" in str(e) or "HBM" in str(e) else "failed"
                r.reason = f"compile for TPU: {str(e).splitlines()[0][:160]}"
            if progress is not None:
                progress(r, i, len(checked))
    return TuneResult(dims.name, "predicted", hw, label, rows, rejected, winner)
