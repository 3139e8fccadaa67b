"""The tuner: enumerate, predict with the cost model, reject what cannot fit, measure the best-ranked
fraction (measured mode) or rank by prediction (predicted mode), and explain every rejection."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tputool.partition import partition_specs
from tputool.tune.candidate import Candidate, ModelDims
from tputool.tune.cost_model import Estimate, estimate
from tputool.tune.hardware import Hardware
from tputool.tune.measure import Measurement
from tputool.tune.space import Rejected, SearchSpace, enumerate_space

GIB = 1024**3


def fmt_bytes(n: float) -> str:
    """Bytes in GiB, MiB or KiB, whichever reads best."""
    for unit, size in (("GiB", GIB), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


@dataclass
class Row:
    """One candidate's fate in a search."""

    candidate: Candidate
    estimate: Estimate
    predicted_rank: int = 0
    status: str = "predicted"  # measured | predicted | compiled | pruned | memory | failed (running: while run)
    reason: str = ""
    measurement: Measurement | None = None
    compiled_memory: float | None = None  # bytes/device from a TPU compile (predicted mode)
    corrected_step_s: float | None = None  # roofline x measured corrections (measured mode)

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
    correction: object = None  # refine.Correction fitted in measured mode
    no_fit: object = None  # advice.NoFit when no candidate fits (predicted mode)

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
                param_shapes: dict[str, tuple[int, ...]] | None = None,
                kernels: bool = False) -> tuple[list[Row], list[Rejected]]:
    """Every valid candidate with its estimate, ranked by predicted throughput; memory misfits flagged.

    `kernels`: the default attention choices include the Pallas TPU kernels (predicted mode).
    """
    enum = enumerate_space(dims, hw.n_devices, space, kernels=kernels)
    rows = []
    local_by_mesh: dict[tuple[int, int, int], int] = {}  # the partition depends on the mesh only
    for c in enum.candidates:
        local = None
        if param_shapes is not None:
            mesh = (c.data, c.fsdp, c.tensor)
            if mesh not in local_by_mesh:
                local_by_mesh[mesh] = partition_specs(param_shapes, c.mesh).local_elements(param_shapes, c.mesh)
            local = local_by_mesh[mesh]
        rows.append(Row(c, estimate(dims, c, hw, params_per_device=local)))
    # ties (compute-bound candidates hide their collectives) go to less communication, then less memory
    rows.sort(key=lambda r: (-r.estimate.tokens_per_s, r.estimate.comm_s, r.estimate.memory.total))
    for i, r in enumerate(rows, 1):
        r.predicted_rank = i
        if not r.estimate.fits:
            r.status = "memory"
            r.reason = (f"predicted {fmt_bytes(r.estimate.memory.total)}/device > "
                        f"{fmt_bytes(r.estimate.hbm_bytes)} available")
    return rows, enum.rejected


def run_budget(n_candidates: int, fraction: float) -> int:
    """How many candidates may be run: at most `fraction` of them (at least one)."""
    return max(1, int(n_candidates * fraction))


def _measure_row(r: Row, run: Callable[[Candidate], Measurement]) -> None:
    try:
        r.measurement = run(r.candidate)
        r.status = "measured"
    except Exception as e:  # noqa: BLE001 - a failing candidate is a finding, not a crash
        r.status = "failed"
        r.reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:200]


def tune_measured(dims: ModelDims, hw: Hardware, space: SearchSpace,
                  run: Callable[[Candidate], Measurement], fraction: float = 1 / 3,
                  param_shapes: dict[str, tuple[int, ...]] | None = None,
                  progress: Callable[[Row, int, int], None] | None = None, label: str = "",
                  refine: bool = True, top: int | None = None) -> TuneResult:
    """Run at most `fraction` of the fitting candidates (and at most `top`) with `run`, chosen by the cost
    model; fastest wins. `progress(row, i, n)` is called before (row.status "running") and after each run.

    With `refine`, the first half of the budget goes to the predicted-best candidate of each mesh shape,
    then each next candidate is the best by the roofline corrected with the measurements so far (see
    refine.py). Without it, the roofline's top candidates are run. Candidates predicted not to fit are
    flagged and never run; the rest are recorded as pruned with their rank.
    """
    from tputool.tune import refine as refine_mod

    rows, rejected = predict_all(dims, hw, space, param_shapes)
    budget = run_budget(len(rows), fraction)
    if top is not None:
        budget = max(1, min(budget, top))
    fitting = [r for r in rows if r.status != "memory"]
    done: list[Row] = []

    def step(r: Row) -> None:
        if progress is not None:
            r.status = "running"
            progress(r, len(done), min(budget, len(fitting)))
        _measure_row(r, run)
        done.append(r)
        if progress is not None:
            progress(r, len(done), min(budget, len(fitting)))

    if not refine:
        for r in fitting[:budget]:
            step(r)
    else:
        seen_mesh: set[tuple[int, int, int]] = set()
        for r in fitting:
            mesh = (r.candidate.data, r.candidate.fsdp, r.candidate.tensor)
            if mesh not in seen_mesh and len(done) < max(1, budget // 2):
                seen_mesh.add(mesh)
                step(r)
        while len(done) < min(budget, len(fitting)):
            corr = refine_mod.fit([(r.candidate, r.estimate.step_s, r.measurement.step_s)
                                   for r in done if r.measurement is not None])
            left = [r for r in fitting if r not in done]
            step(max(left, key=lambda r: r.estimate.tokens_per_step / (r.estimate.step_s * corr.factor(r.candidate))))
    corr = refine_mod.fit([(r.candidate, r.estimate.step_s, r.measurement.step_s)
                           for r in done if r.measurement is not None]) if refine else None
    for r in rows:
        r.corrected_step_s = r.estimate.step_s * corr.factor(r.candidate) if corr else None
    measured = [r for r in rows if r.status == "measured"]
    best_measured = max((r.measured_tokens_per_s for r in measured), default=0.0)
    left = sorted((r for r in fitting if r not in done), key=lambda r: r.corrected_step_s or r.estimate.step_s)
    for r in left:
        r.status = "pruned"
        pred = r.estimate.tokens_per_step / (r.corrected_step_s or r.estimate.step_s)
        kind = "corrected prediction" if corr else "prediction"
        r.reason = (f"predicted rank {r.predicted_rank}/{len(rows)}; {kind} {pred:,.0f} tok/s vs best measured "
                    f"{best_measured:,.0f}; outside the run budget of {budget}")
    winner = max(measured, key=lambda r: r.measured_tokens_per_s) if measured else None
    result = TuneResult(dims.name, "measured", hw, label or f"measured on {hw.name}", rows, rejected, winner,
                        budget)
    result.correction = corr
    if not fitting and rows:
        from tputool.tune.advice import explain

        result.no_fit = explain(dims, hw, space, rows, kernels=False)
    return result


COMPILE_MORE = 3
"""tune_predicted compiles up to this many times `top` candidates when the first `top` do not fit when compiled
(the cost model's memory estimate can be low: a large vocabulary's logits at a long sequence, for one)."""


def tune_predicted(dims: ModelDims, hw: Hardware, space: SearchSpace,
                   param_shapes: dict[str, tuple[int, ...]] | None = None,
                   compile_check: Callable[[Candidate], float] | None = None, top: int = 5,
                   progress: Callable[[Row, int, int], None] | None = None) -> TuneResult:
    """Rank by the cost model; with `compile_check` (a TPU compile returning bytes/device, raising on OOM),
    confirm memory fit of the top `top` fitting candidates and take the best that compiles. When none of them
    compiles within HBM, the next ones are compiled in rank order until one does (at most COMPILE_MORE x `top`)."""
    rows, rejected = predict_all(dims, hw, space, param_shapes, kernels=True)
    fitting = [r for r in rows if r.status != "memory"]
    label = f"estimated for {hw.name}"
    winner = fitting[0] if fitting else None
    if compile_check is not None:
        label = f"cost model ranked, memory checked by compiling for {hw.slice.topology_name if hw.slice else hw.name}"
        winner = None
        limit = min(len(fitting), COMPILE_MORE * top)
        for i, r in enumerate(fitting[:limit], 1):
            if i > top and winner is not None:
                break
            try:
                r.compiled_memory = compile_check(r.candidate)
                if r.compiled_memory > hw.hbm_bytes:
                    r.status, r.reason = "memory", f"compiled {fmt_bytes(r.compiled_memory)}/device > HBM"
                else:
                    r.status = "compiled"
                    if winner is None:
                        winner = r
            except Exception as e:  # noqa: BLE001 - RESOURCE_EXHAUSTED and other compile failures
                r.status = "memory" if "RESOURCE_EXHAUSTED" in str(e) or "HBM" in str(e) else "failed"
                r.reason = f"compile for TPU: {str(e).splitlines()[0][:160]}"
            if progress is not None:
                progress(r, i, min(len(fitting), top) if i <= top else limit)
    result = TuneResult(dims.name, "predicted", hw, label, rows, rejected, winner)
    if not fitting and rows:
        from tputool.tune.advice import explain

        result.no_fit = explain(dims, hw, space, rows)
    return result
