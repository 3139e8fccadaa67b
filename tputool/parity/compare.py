"""How far one recorded tensor is from its reference, and whether the dtypes explain it.

"Explained" uses torch.testing.assert_close's default (rtol, atol) for the precision the reference value
passed through (its record's `carried` precision: a float32 LayerNorm output computed from bfloat16 matmuls
carries bfloat16 error; its own dtype when the record has none), times a slack that grows with the step
(`slack * (1 + step)`: errors of a correct port accumulate through training). The absolute allowance is the
larger of atol scaled by the reference's RMS when that is above 1, and rtol times the RMS: an error that is
small next to the tensor's values is rounding, even on an element near zero (where the relative error of a
rounded sum is meaningless). An element departs when |x - ref| > f * (atol + rtol * |ref|); a tensor departs
when any element does. An output the tpu run computed in a lower precision than the reference (bf16
autocast vs float32) is therefore not explained: that is a cause to name, not a tolerance to widen.

`max_rel` is reported over the elements that are not near zero (at least `NEAR_ZERO` of the largest magnitude).
`ratio` is the error against that allowance: the largest |x - ref| / (atol + rtol * |ref|) over the elements,
so a tensor departs when it is above 1 (a NaN where the reference has none, or an error where the allowance is
0, is infinite). The HTML report plots it.

`needed` is what TorchTPU's helper reports: the smallest atol that makes assert_close pass at the dtype's
default rtol, and the smallest rtol that does at the dtype's default atol.
"""

from __future__ import annotations

import math

import torch

DEFAULT_SLACK = 8.0
NEAR_ZERO = 1e-3
"""`max_rel` is taken over the elements at least this fraction of the tensor's largest magnitude (as `ulps`): the
relative error of a rounded element near zero says nothing (a gradient of 1e-20 off by 1e-12 is 1e8 relative)."""
TOLERANCES: dict[str, tuple[float, float]] = {
    "torch.float16": (1e-3, 1e-5), "torch.bfloat16": (1.6e-2, 1e-5), "torch.float32": (1.3e-6, 1e-5),
    "torch.float64": (1e-7, 1e-7), "torch.complex64": (1.3e-6, 1e-5), "torch.complex128": (1e-7, 1e-7),
}
"""torch.testing.assert_close's default (rtol, atol) per dtype; every other dtype compares exactly."""
MANTISSA_BITS = {"torch.float16": 10, "torch.bfloat16": 7, "torch.float32": 23, "torch.float64": 52}
_RANK = ["torch.float16", "torch.bfloat16", "torch.float32", "torch.float64"]


def tolerance(dtype: str) -> tuple[float, float]:
    """assert_close's default (rtol, atol) for a dtype name like 'torch.float32' ((0, 0) for exact dtypes)."""
    return TOLERANCES.get(dtype, (0.0, 0.0))


def lower_precision(dtype: str, than: str) -> bool:
    """True when floating `dtype` carries fewer bits than `than` (bfloat16 vs float32)."""
    if dtype not in MANTISSA_BITS or than not in MANTISSA_BITS:
        return False
    return MANTISSA_BITS[dtype] < MANTISSA_BITS[than]


def ulps(diff: torch.Tensor, ref: torch.Tensor, dtype: str) -> float:
    """The largest error in units in the last place of `dtype`, over elements not near zero (|ref| >= 1e-3 max)."""
    bits = MANTISSA_BITS.get(dtype)
    if bits is None or ref.numel() == 0:
        return 0.0
    mag = ref.abs()
    keep = mag >= NEAR_ZERO * float(mag.max())
    if not bool(keep.any()):
        return 0.0
    _, exp = torch.frexp(mag[keep].double())
    spacing = torch.ldexp(torch.ones_like(mag[keep], dtype=torch.float64), (exp - 1 - bits).to(torch.int64))
    return float((diff[keep].double() / spacing).max())


def allowance_dtype(ref: dict) -> str:
    """The dtype whose tolerance applies: the lower of the reference's dtype and the precision it carried."""
    carried = ref.get("carried")
    return carried if carried and lower_precision(carried, ref["dtype"]) else ref["dtype"]


def _stats_diff(tpu: dict, ref: dict, step: int, slack: float) -> dict:
    """Compare two summaries (tensors too big to keep): the errors of mean, std and norm relative to the
    reference's scale (the mean's against the RMS too: a mean near zero has no meaningful relative error)."""
    rtol, atol = tolerance(allowance_dtype(ref))
    s = ref["stats"]
    scale = {"mean": max(abs(s["mean"]), math.hypot(s["mean"], s["std"])), "std": abs(s["std"]),
             "norm": abs(s["norm"])}
    errs = []
    for k in ("mean", "std", "norm"):
        a, b = tpu["stats"][k], s[k]
        errs.append(abs(a - b) / max(scale[k], 1e-30))
    rel = max(errs)
    f = slack * (1 + step)
    allowed = f * max(rtol, 1e-12) * 10
    return {"max_abs": None, "max_rel": rel, "ulps": None, "beyond": rel > allowed, "ratio": rel / allowed,
            "explained": {"rtol": f * rtol, "atol": f * atol}, "needed": None, "stats_only": True}


def diff(tpu: dict, ref: dict, step: int = 0, slack: float = DEFAULT_SLACK) -> dict:
    """Compare the recorded tensor `tpu` with `ref` (both record entries: value or stats, dtype, shape)."""
    if tpu.get("value") is None or ref.get("value") is None:
        if tpu.get("stats") and ref.get("stats"):
            return _stats_diff(tpu, ref, step, slack)
        return {"max_abs": None, "max_rel": None, "ulps": None, "beyond": False, "explained": None, "needed": None}
    a, b = tpu["value"], ref["value"]
    if tuple(a.shape) != tuple(b.shape):
        return {"max_abs": None, "max_rel": None, "ulps": None, "beyond": True, "explained": None, "needed": None,
                "shape": [list(a.shape), list(b.shape)]}
    rtol, atol = tolerance(allowance_dtype(ref))
    a64, b64 = a.double(), b.double()
    d = (a64 - b64).abs()
    nan_mismatch = bool((a64.isnan() != b64.isnan()).any())
    d = torch.where(a64.isnan() & b64.isnan(), torch.zeros_like(d), d)
    mag = b64.abs()
    if d.numel() == 0:
        return {"max_abs": 0.0, "max_rel": 0.0, "ulps": 0.0, "beyond": False,
                "explained": {"rtol": rtol, "atol": atol}, "needed": {"atol": 0.0, "rtol": 0.0}}
    max_abs = float(d.max())
    rel = d / mag.clamp_min(1e-30)
    big = mag >= NEAR_ZERO * float(mag.max())  # (an element near zero has no meaningful relative error)
    max_rel = float(rel[big].max()) if bool(big.any()) else 0.0
    f = slack * (1 + step)
    rms = float(b64.pow(2).mean().sqrt()) if b64.numel() else 0.0
    rms = rms if math.isfinite(rms) else 1.0
    e_rtol, e_atol = f * rtol, f * max(atol * max(1.0, rms), rtol * rms)
    allowed = e_atol + e_rtol * mag
    beyond = nan_mismatch or bool((d > allowed).any())
    over_allowed = torch.where(d > 0, d / allowed, torch.zeros_like(d))  # d > 0 over 0 allowed: inf
    ratio = math.inf if nan_mismatch else float(over_allowed.nan_to_num(nan=0.0, posinf=math.inf).max())
    need_atol = float((d - rtol * mag).clamp_min(0).max())
    over = d > atol
    if bool(over.any()):
        zero_ref = bool((mag[over] == 0).any())
        need_rtol = math.inf if zero_ref else float(((d[over] - atol) / mag[over]).max())
    else:
        need_rtol = 0.0
    return {"max_abs": max_abs, "max_rel": max_rel, "ulps": ulps(d, b64, ref["dtype"]), "beyond": beyond,
            "ratio": ratio, "explained": {"rtol": e_rtol, "atol": e_atol},
            "needed": {"atol": need_atol, "rtol": need_rtol, "at_rtol": rtol, "at_atol": atol}}
