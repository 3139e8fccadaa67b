"""Published TPU training runs (`reference_runs.yaml`) as predictions to check: for each run, search as a
user would (the published model, sequence and global batch; sharding, remat and attention chosen by the
tuner) and compare the winner's predicted MFU and tokens/s/chip with the published ones; fit the
achievable fractions (efficiency.py) on the rows not held out."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from tputool.tune.arch import decoder_dims
from tputool.tune.candidate import ModelDims
from tputool.tune.cost_model import estimate
from tputool.tune.efficiency import Efficiency
from tputool.tune.hardware import tpu_hardware
from tputool.tune.search import Row, predict_all, tune_predicted
from tputool.tune.slices import parse_target
from tputool.tune.space import SearchSpace

REFERENCE_RUNS = Path(__file__).with_name("reference_runs.yaml")

BOUND = 0.15
"""Largest relative error of the predicted MFU the reference benchmark accepts on any row."""


@dataclass(frozen=True)
class ReferenceRun:
    """One published run: where, what, and what it reached."""

    id: str
    target: str
    dims: ModelDims
    per_device_batch: int
    mfu: float  # fraction, in `convention`
    convention: str  # maxtext (causal attention at half) | full (tputool's)
    held_out: bool
    source: str
    tokens_per_s_per_chip: float | None = None

    @property
    def chip(self) -> str:
        """The chip generation (v5e, v5p, v6e, ...)."""
        return parse_target(self.target).chip.name

    @property
    def n_chips(self) -> int:
        """Chips in the run (all slices)."""
        return parse_target(self.target).n_chips

    def published_tokens_per_s_per_chip(self) -> float:
        """The published figure, or the one the published MFU implies."""
        if self.tokens_per_s_per_chip is not None:
            return self.tokens_per_s_per_chip
        sl = parse_target(self.target)
        flops = self.dims.flops_per_token_maxtext if self.convention == "maxtext" else self.dims.flops_per_token
        return self.mfu * sl.chip.peak_bf16_flops * sl.chip.devices_per_chip / flops


@dataclass(frozen=True)
class Prediction:
    """The tuner's winner for a reference run and how it compares."""

    run: ReferenceRun
    winner: Row | None

    @property
    def mfu(self) -> float:
        """Predicted MFU in the run's convention (0 when nothing fits)."""
        if self.winner is None:
            return 0.0
        e = self.winner.estimate
        return e.mfu_maxtext if self.run.convention == "maxtext" else e.mfu

    @property
    def tokens_per_s_per_chip(self) -> float:
        """Predicted tokens/s per chip."""
        if self.winner is None:
            return 0.0
        sl = parse_target(self.run.target)
        return self.winner.estimate.tokens_per_s / sl.n_chips

    @property
    def ratio(self) -> float:
        """Predicted / published MFU."""
        return self.mfu / self.run.mfu

    @property
    def within_bound(self) -> bool:
        """Relative MFU error within BOUND."""
        return abs(self.ratio - 1.0) <= BOUND


def load_runs(path: str | Path | None = None) -> list[ReferenceRun]:
    """The reference runs of a YAML file (default: the shipped reference_runs.yaml)."""
    import yaml

    doc = yaml.safe_load(Path(path or REFERENCE_RUNS).read_text())
    models = doc["models"]
    runs = []
    for r in doc["runs"]:
        m = dict(models[r["model"]])
        dims = decoder_dims(r["model"], seq=int(r["seq"]), capacity=float(r.get("capacity", 1.0)), **m)
        if r.get("weight_dtype") == "bf16":
            dims = replace(dims, state_bytes_per_param=8)
        runs.append(ReferenceRun(
            id=r["id"], target=str(r["target"]), dims=dims, per_device_batch=int(r["pdb"]),
            mfu=float(r["mfu"]) / 100, convention=r["convention"], held_out=bool(r["held_out"]),
            source=r["source"], tokens_per_s_per_chip=r.get("tokens_per_s_per_chip")))
    return runs


def search_space(run: ReferenceRun) -> SearchSpace:
    """What a user would search: the published global batch, bf16, every remat and the default attentions."""
    sl = parse_target(run.target)
    return SearchSpace(global_batch=run.per_device_batch * sl.n_chips, precisions=("bf16",))


def predict(run: ReferenceRun, efficiency: Efficiency | None = None, calibration: str | None = None) -> Prediction:
    """Search `run` with the cost model (the shipped calibration unless `efficiency`/`calibration` is given)."""
    hw = tpu_hardware(run.target, calibration=calibration, efficiency=efficiency)
    result = tune_predicted(run.dims, hw, search_space(run))
    return Prediction(run, result.winner)


FITTED = ("matmul", "attention", "hbm", "ici")


FIT_BOUNDS = {"matmul": (0.4, 0.95), "attention": (0.3, 0.95), "hbm": (0.5, 0.95), "ici": (0.5, 0.95),
              "overlap_cost": (0.0, 0.5)}
"""Physically plausible range of each fitted fraction (the fit may not wander outside)."""


def _winner_mfu(run: ReferenceRun, candidates: list, hw) -> float:
    best = max((estimate(run.dims, c, hw) for c in candidates), key=lambda e: e.tokens_per_s, default=None)
    if best is None:
        return 0.0
    return best.mfu_maxtext if run.convention == "maxtext" else best.mfu


def fit(runs: list[ReferenceRun], start: dict[str, Efficiency] | None = None,
        iterations: int = 2000) -> dict[str, Efficiency]:
    """Fit achievable fractions on `runs` (the fit rows): the matmul fraction per chip generation; the
    attention fraction (at most the chip's matmul fraction), HBM and ICI fractions and the overlap cost
    shared by all chips, each inside FIT_BOUNDS. Least squares on log(predicted/published MFU) of each
    run's winner. Memory fit does not depend on the fractions, so each run's fitting candidates are
    enumerated once."""
    import numpy as np
    from scipy.optimize import minimize

    chips = sorted({r.chip for r in runs})
    fitting = {}
    for r in runs:
        rows, _ = predict_all(r.dims, tpu_hardware(r.target, efficiency=Efficiency()), search_space(r), kernels=True)
        fitting[r.id] = [row.candidate for row in rows if row.status != "memory"]
    names = ["matmul"] * len(chips) + ["attention", "hbm", "ici", "overlap_cost"]

    def unpack(x) -> dict[str, Efficiency]:
        mm = x[:len(chips)]
        attn, hbm, ici, overlap = x[len(chips):]
        return {ch: Efficiency(matmul=float(mm[i]), attention=float(min(attn, mm[i])), hbm=float(hbm),
                               ici=float(ici), overlap_cost=float(overlap)) for i, ch in enumerate(chips)}

    def loss(x) -> float:
        effs = unpack(x)
        total = 0.0
        for r in runs:
            mfu = _winner_mfu(r, fitting[r.id], tpu_hardware(r.target, efficiency=effs[r.chip]))
            total += math.log(max(mfu / r.mfu, 1e-3)) ** 2
        return total

    s0 = Efficiency(0.8, 0.8, 0.8, 0.8, overlap_cost=0.1)
    x0 = [(start or {}).get(ch, s0).matmul for ch in chips] + [s0.attention, s0.hbm, s0.ici, s0.overlap_cost]
    if start:
        first = next(iter(start.values()))
        x0[len(chips):] = [first.attention, first.hbm, first.ici, first.overlap_cost]
    bounds = [FIT_BOUNDS[n] for n in names]
    x0 = [min(max(v, lo), hi) for v, (lo, hi) in zip(x0, bounds, strict=True)]
    res = minimize(loss, np.array(x0), method="Powell", bounds=bounds,
                   options={"maxfev": iterations, "xtol": 1e-3, "ftol": 1e-6})
    return unpack(res.x)
