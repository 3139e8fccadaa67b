"""The rule table: well-formed unique codes, docs, pattern coverage, and a fixture for every rule."""

from __future__ import annotations

import re

from tests.codemods.rules_fixtures import load_fixtures
from tputool.rules.model import FixSafety, RuleClass
from tputool.rules.port import RULES

FIXTURES = load_fixtures()


def test_codes_well_formed_and_unique() -> None:
    names = [r.name for r in RULES.values()]
    assert len(names) == len(set(names))
    for code, rule in RULES.items():
        assert code == rule.code
        assert re.fullmatch(r"TPU[1-6]\d\d", code), code  # TPU9xx is the engine's
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name), rule.name
        assert rule.message and "\n" not in rule.message
        assert "Before:" in rule.doc and len(rule.doc) > 80


def test_every_rule_has_a_fixture_and_fixable_rules_a_rewrite() -> None:
    by_code: dict[str, list] = {}
    for fx in FIXTURES:
        by_code.setdefault(fx.code, []).append(fx)
    for code, rule in RULES.items():
        assert code in by_code, f"no fixture for {code}"
        fxs = by_code[code]
        if rule.fix is FixSafety.SAFE:
            assert any(f.out is not None for f in fxs), f"{code}: no .out.py"
        elif rule.fix is FixSafety.UNSAFE:
            assert any(f.unsafe_out is not None for f in fxs), f"{code}: no .unsafe.out.py"
        else:
            assert all(f.out is None and f.unsafe_out is None for f in fxs), f"{code}: finding-only rule rewrote"


def test_fixture_names_match_rules() -> None:
    for fx in FIXTURES:
        code, name = fx.name.split("_", 1)
        assert RULES[code].name == name


def test_classes_agree_with_fix_safety() -> None:
    for rule in RULES.values():
        if rule.rule_class in (RuleClass.AUTO, RuleClass.AUTO_NOTE):
            assert rule.fix is FixSafety.SAFE, rule.code
        if rule.rule_class is RuleClass.BLOCKER:
            assert rule.fix is FixSafety.NONE, rule.code


def test_every_pattern_row_is_covered() -> None:
    covered = {p for r in RULES.values() for p in r.patterns}
    assert all(1 <= p <= 85 for p in covered)
    assert covered == set(range(1, 86))
