"""What makes a statement "hot" for cold.py: the pre-filter triggers, some narrowed to what their rules need.

The file pre-filter (PYTHON_TRIGGERS) matches bytes anywhere; inside a file the rewriter can be stricter
per statement, which is what lets it hide most of a big module:
- `words` are identifiers a rule only fires on as a whole token (`.item()`, `torch.where`), so `items` or
  `sorted` do not make a statement hot;
- `digit_words` are the dimension names of TPU603, which fires only on an integer literal: they make a
  statement hot only when it also holds a digit;
- every other trigger stays a plain substring.
tests/codemods/test_cold.py checks that hiding statements never changes what `port` produces.
"""

from __future__ import annotations

from dataclasses import dataclass

from tputool.codemods.python.tables import DIM_NAMES, DYNAMIC_SHAPE_FUNCS, HOST_SYNC_METHODS, INT64_SORTS

# Triggers whose rules look only at a whole identifier (HOST_SYNC_METHODS, torch.where, int64 sorts,
# torch.compile), and the extra spellings the plain substring covered (argsort, msort, unique_consecutive).
WORD_TRIGGERS: frozenset[str] = frozenset({"where", "compile", *HOST_SYNC_METHODS, *INT64_SORTS, *DYNAMIC_SHAPE_FUNCS})
# The plain triggers these replace (each is a word trigger or a substring of one).
NARROWED: frozenset[str] = frozenset({"item", "cpu", "tolist", "numpy", "where", "sort", "topk", "compile",
                                      "nonzero", "unique", "masked_select", "argwhere"})


@dataclass(frozen=True)
class MaskTriggers:
    """Trigger strings by kind: plain substrings, whole words, and words that need a digit beside them."""

    substrings: tuple[str, ...]
    words: frozenset[str]
    digit_words: frozenset[str]


def mask_triggers(plain: tuple[str, ...]) -> MaskTriggers:
    """Split the pre-filter's trigger strings into the three kinds."""
    narrowed = NARROWED | DIM_NAMES
    missing = narrowed - set(plain)
    if missing:
        raise ValueError(f"narrowed triggers that are not pre-filter triggers: {sorted(missing)}")
    return MaskTriggers(tuple(t for t in plain if t not in narrowed), WORD_TRIGGERS, DIM_NAMES)
