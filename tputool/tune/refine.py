"""Correct the cost model with the measurements made so far (measured mode).

log(measured step / predicted step) is fitted as a sum of one term per knob value (mesh shape, batch,
remat, attention, precision) by ridge regression towards zero (zero = trust the roofline). The host the
tuner measures on (e.g. simulated CPU devices sharing two cores) has costs a roofline does not model;
the corrections learn them from the few candidates run and re-rank the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tputool.tune.candidate import Candidate

RIDGE = 1.0
"""Regularisation strength: with few measurements the corrections stay near the roofline."""


def features(c: Candidate) -> list[str]:
    """The knob values of a candidate, one indicator each."""
    attn = c.attention_label
    return [f"mesh=d{c.data}f{c.fsdp}t{c.tensor}", f"batch={c.batch}", f"remat={c.remat}", f"attention={attn}",
            f"precision={c.precision}"]


@dataclass
class Correction:
    """Fitted log-ratio terms; `factor(c)` multiplies a predicted step time."""

    terms: dict[str, float]
    bias: float = 0.0

    def factor(self, c: Candidate) -> float:
        """exp(bias + sum of the candidate's terms); unseen knob values contribute 0."""
        return math.exp(self.bias + sum(self.terms.get(f, 0.0) for f in features(c)))


def fit(samples: list[tuple[Candidate, float, float]], ridge: float = RIDGE) -> Correction:
    """Fit from (candidate, predicted step, measured step) triples."""
    import numpy as np

    if not samples:
        return Correction({})
    names = sorted({f for c, _, _ in samples for f in features(c)})
    index = {n: i for i, n in enumerate(names)}
    x = np.zeros((len(samples), len(names)))
    y = np.zeros(len(samples))
    for row, (c, pred, meas) in enumerate(samples):
        for f in features(c):
            x[row, index[f]] = 1.0
        y[row] = math.log(meas / pred)
    bias = float(y.mean())  # the overall scale is free (a host is uniformly slower than its roofline)
    theta = np.linalg.solve(x.T @ x + ridge * np.eye(len(names)), x.T @ (y - bias))
    return Correction({n: float(theta[index[n]]) for n in names}, bias)
