"""Classify an HLO op name as collective or compute, and into the cost model's op classes (data: name stems)."""

from __future__ import annotations

COLLECTIVE_STEMS = (
    "all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all",
    "ragged-all-to-all", "collective-broadcast", "send", "recv",
)
"""HLO opcode stems of cross-device communication (also matched with `_` in place of `-`)."""


def classify(op_name: str) -> str:
    """'collective' when the op (or fusion) name starts with a collective stem, else 'compute'."""
    name = op_name.lower().replace("_", "-")
    for prefix in ("fusion.", "async-", "wrapped-"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    for stem in COLLECTIVE_STEMS:
        if name.startswith(stem) or f"-{stem}" in name and stem not in ("send", "recv"):
            return "collective"
    return "compute"


MATMUL_MARKS = ("dot", "convolution", "conv", "gemm", "matmul", "einsum", "ynn")
"""Name fragments of matmul ops and the fusions XLA names after them (ynn: XLA:CPU's YNNPACK dot fusions)."""

ATTENTION_MARKS = ("flash", "splash", "attention", "mha", "sdpa")
"""Name fragments of attention kernels (Pallas custom calls and their fusions)."""


def op_class(op_name: str) -> str:
    """The cost model's class of an op: 'collective', 'attention', 'matmul' or 'elementwise' (memory-bound).

    By name only: a TPU fusion named `fusion.N` that hides a dot counts as elementwise.
    """
    if classify(op_name) == "collective":
        return "collective"
    name = op_name.lower()
    if any(m in name for m in ATTENTION_MARKS):
        return "attention"
    if any(m in name for m in MATMUL_MARKS):
        return "matmul"
    return "elementwise"
