"""The rule catalogue: every published code (port/check TPU1xx-9xx and diagnose's TPU8xx) by code."""

from __future__ import annotations

from functools import lru_cache

from tputool.errors import UserError
from tputool.rules.model import Rule
from tputool.rules.text import TEXT_RULES


@lru_cache(maxsize=1)
def all_rules() -> dict[str, Rule]:
    """All port/check rules by code, sorted by code."""
    from tputool.rules.port import RULES

    merged = {**RULES, **TEXT_RULES}
    return dict(sorted(merged.items()))


@lru_cache(maxsize=1)
def python_codes() -> frozenset[str]:
    """Codes of the rules the Python rewriter can fire."""
    from tputool.rules.port import RULES

    return frozenset(c for c in RULES if c not in TEXT_RULES)


@lru_cache(maxsize=1)
def listed_rules() -> dict[str, tuple[Rule, str]]:
    """Every rule `tputool rules` shows, with the command that reports it (port/check or diagnose)."""
    from tputool.rules.runtime import BY_CODE

    out = {code: (rule, "port/check") for code, rule in all_rules().items()}
    for code, rule in BY_CODE.items():
        out.setdefault(code, (rule, "diagnose"))
    return dict(sorted(out.items()))


def get_rule(code: str) -> Rule:
    """The rule with this code (port/check or diagnose); UserError when there is none."""
    rules = {c: r for c, (r, _) in listed_rules().items()}
    key = code.strip().upper()
    if key not in rules:
        raise UserError(f"unknown rule {code!r} (run `tputool rules` for the list)")
    return rules[key]
