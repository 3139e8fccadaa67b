"""Achievable fractions of a chip's peak rates (the cost model's calibrated constants), and where they live.

The spec table gives peaks; real kernels reach a fraction of them. These fractions are physical
properties of a chip generation and the XLA/Pallas code that runs on it, not of a model: one set per
generation, fitted on published runs (`tputool/tune/reference_runs.yaml`, `benchmarks/tune_reference.py`)
or refitted from a profiler trace of the user's own machine (`tputool tune --calibrate TRACE_DIR`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from tputool.errors import UserError

DEFAULT_CALIBRATION = Path(__file__).with_name("calibration.yaml")
"""The fractions fitted on the reference runs' fit rows, shipped with tputool."""


@dataclass(frozen=True)
class Efficiency:
    """Fractions of peak reached by each op class, and the fixed cost of a step."""

    matmul: float = 1.0  # large matmuls on the MXU
    attention: float = 1.0  # the matmuls of an attention kernel (softmax and masking on the vector units)
    hbm: float = 1.0  # memory-bound ops (norms, elementwise, softmax through HBM, the optimizer update)
    ici: float = 1.0  # ring collectives over ICI links
    dcn: float = 1.0  # collectives across slices
    overlap_cost: float = 0.0  # share of a hidden collective's time still paid (HBM/DMA contention)
    step_fixed_s: float = 0.0  # per step: launch, host sync, infeed

    def to_dict(self) -> dict[str, float]:
        """Plain data for YAML."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: dict) -> Efficiency:
        """Parse; unknown keys are a UserError, missing ones keep the default."""
        names = {f.name for f in dataclasses.fields(cls)}
        bad = set(doc) - names
        if bad:
            raise UserError(f"calibration: unknown field(s) {', '.join(sorted(bad))} (known: {', '.join(sorted(names))})")
        vals = {k: float(v) for k, v in doc.items()}
        if any(v <= 0 for k, v in vals.items() if k not in ("step_fixed_s", "overlap_cost")):
            raise UserError(f"calibration: fractions must be > 0, got {vals}")
        return cls(**vals)


def load_calibration(path: str | Path | None = None) -> dict[str, Efficiency]:
    """Chip name (v5e, v6e, ...) -> Efficiency from a calibration YAML (default: the shipped fit)."""
    import yaml

    p = Path(path) if path is not None else DEFAULT_CALIBRATION
    if not p.is_file():
        raise UserError(f"calibration file not found: {p}")
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{p} is not valid YAML: {str(e).splitlines()[0]}") from e
    chips = doc.get("chips") if isinstance(doc, dict) else None
    if not isinstance(chips, dict):
        raise UserError(f"{p}: expected a 'chips:' mapping of chip name -> fractions")
    return {str(k): Efficiency.from_dict(v or {}) for k, v in chips.items()}


def write_calibration(path: str | Path, chips: dict[str, Efficiency], source: str) -> Path:
    """Write chip -> Efficiency as a calibration YAML, noting where the numbers came from."""
    import yaml

    p = Path(path)
    doc = {"tputool_calibration": 1, "source": source, "chips": {k: v.to_dict() for k, v in chips.items()}}
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    return p
