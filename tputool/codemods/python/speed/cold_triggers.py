"""What makes a statement "hot" for cold.py: the catalogue's triggers by kind (see registry.Triggers).

The file pre-filter (PYTHON_TRIGGERS) matches bytes anywhere; inside a file the rewriter can be stricter
per statement, which is what lets it hide most of a big module:
- `words` are identifiers a rule only fires on as a whole token (`.item()`, `torch.where`), so `items` or
  `sorted` do not make a statement hot;
- `digit_words` are the dimension names of TPU603, which fires only on an integer literal: they make a
  statement hot only when it also holds a digit;
- every other trigger stays a plain substring.
A rule declares each trigger's kind in its catalogue entry (`Port.triggers/words/digit_words`).
tests/codemods/test_cold.py checks that hiding statements never changes what `port` produces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tputool.codemods.python.registry import Triggers


@dataclass(frozen=True)
class MaskTriggers:
    """Trigger strings by kind: plain substrings, whole words, and words that need a digit beside them."""

    substrings: tuple[str, ...]
    words: frozenset[str]
    digit_words: frozenset[str]


def mask_triggers(triggers: Triggers) -> MaskTriggers:
    """The catalogue's triggers as cold.py reads them."""
    return MaskTriggers(triggers.plain, frozenset(triggers.words), frozenset(triggers.digit_words))
