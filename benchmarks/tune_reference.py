"""Does `tputool tune --target` predict what published TPU runs reach? (pure arithmetic, no device)

For every run of tputool/tune/reference_runs.yaml (MaxText's published pre-training results), searches
as a user would (the published model, sequence length and global batch; mesh, remat and attention chosen
by the tuner) and prints the winner's predicted MFU in both conventions (tputool's: causal attention
counted in full; MaxText's: at half) against the published one, tokens/s/chip, and the ratio. Fit rows
and held-out rows are reported apart. Exits 1 if any row's MFU is off by more than 15% (relative).

    python benchmarks/tune_reference.py            # check the shipped calibration
    python benchmarks/tune_reference.py --fit      # refit the fractions on the fit rows, write calibration.yaml
"""

from __future__ import annotations

import argparse
import sys
import time

from tputool.tune.efficiency import DEFAULT_CALIBRATION, Efficiency, load_calibration, write_calibration
from tputool.tune.reference import BOUND, Prediction, fit, load_runs, predict


def _rounded(e: Efficiency) -> Efficiency:
    return Efficiency(**{k: round(v, 3) for k, v in e.to_dict().items()})


def _line(p: Prediction) -> str:
    r, w = p.run, p.winner
    e = w.estimate if w else None
    conv = "MT" if r.convention == "maxtext" else "tt"
    plan = w.candidate.key if w else "nothing fits"
    return (f"{r.id:20s} {r.target:11s} {100 * r.mfu:6.2f}% {conv}  "
            f"{100 * e.mfu if e else 0:6.2f}% {100 * e.mfu_maxtext if e else 0:6.2f}%  {p.ratio:5.2f}  "
            f"{r.published_tokens_per_s_per_chip():8,.0f} {p.tokens_per_s_per_chip:8,.0f}  "
            f"{'ok  ' if p.within_bound else 'MISS'} {plan}")


def main() -> int:
    """Print the reference table; refit first with --fit."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", action="store_true", help="refit the achievable fractions on the fit rows")
    ap.add_argument("--calibration", default=None, help="a calibration YAML to check instead of the shipped one")
    args = ap.parse_args()
    runs = load_runs()
    calibration = args.calibration
    if args.fit:
        t0 = time.perf_counter()
        start = load_calibration(calibration)  # refit from the current fractions
        effs = {k: _rounded(v) for k, v in fit([r for r in runs if not r.held_out], start=start).items()}
        mean = sum(e.matmul for e in effs.values()) / len(effs)
        any_eff = next(iter(effs.values()))
        effs["default"] = _rounded(Efficiency(matmul=mean, attention=min(any_eff.attention, mean), hbm=any_eff.hbm,
                                              ici=any_eff.ici, overlap_cost=any_eff.overlap_cost))
        write_calibration(DEFAULT_CALIBRATION, effs, "fitted by benchmarks/tune_reference.py --fit on the fit "
                          "rows of tputool/tune/reference_runs.yaml")
        print(f"fitted in {time.perf_counter() - t0:.0f} s, wrote {DEFAULT_CALIBRATION}")
    for chip, e in load_calibration(calibration).items():
        print(f"  {chip:8s} " + "  ".join(f"{k}={v:g}" for k, v in e.to_dict().items()))
    print("MFU conventions: tt = tputool's (causal attention counted in full), MT = MaxText's (at half)")
    header = (f"{'run':20s} {'target':11s} {'published':>10s}  {'pred tt':>7s} {'pred MT':>7s}  {'ratio':>5s}  "
              f"{'tok/s/chip':>8s} {'predicted':>8s}  the tuner's plan")
    misses = 0
    for title, held in (("fit rows (the fractions were fitted on these)", False),
                        ("held-out rows (never used to fit)", True)):
        print(f"\n{title}\n{header}")
        worst = 0.0
        for r in (r for r in runs if r.held_out == held):
            p = predict(r, calibration=calibration)
            print(_line(p))
            worst = max(worst, abs(p.ratio - 1))
            misses += not p.within_bound
        print(f"worst relative MFU error: {100 * worst:.1f}% (bound {100 * BOUND:.0f}%)")
    if misses:
        print(f"{misses} row(s) outside the {100 * BOUND:.0f}% bound")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
