"""Every published rule in one place: the Python rewrite rules plus the TPU9xx non-Python rules."""

from __future__ import annotations

from functools import lru_cache

from tputool.codemods.model import Rule
from tputool.codemods.text_rules import TEXT_RULES
from tputool.errors import UserError


@lru_cache(maxsize=1)
def all_rules() -> dict[str, Rule]:
    """All rules by code, sorted by code."""
    from tputool.codemods.rules_table import RULES

    merged = {**RULES, **TEXT_RULES}
    return dict(sorted(merged.items()))


@lru_cache(maxsize=1)
def python_codes() -> frozenset[str]:
    """Codes of the rules the Python rewriter can fire."""
    from tputool.codemods.rules_table import RULES

    return frozenset(c for c in RULES if c not in TEXT_RULES)


def get_rule(code: str) -> Rule:
    """The rule with this code; UserError when there is none."""
    rules = all_rules()
    key = code.strip().upper()
    if key not in rules:
        raise UserError(f"unknown rule {code!r} (run `tputool rules` for the list)")
    return rules[key]
