"""Classify an HLO op name as collective or compute (data: the collective op name stems)."""

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
