"""The diagnose rule table: complete, and consistent with check's codes where they are shared."""

from __future__ import annotations

import re

from tputool.rules.runtime import BY_CODE, FIX, RULES


def test_table_is_complete_and_unique():
    assert len(BY_CODE) == len(RULES)
    assert set(FIX) == set(BY_CODE)
    for r in RULES:
        assert re.fullmatch(r"TPU[68]\d\d", r.code) and re.fullmatch(r"[a-z0-9-]+", r.name)
        assert r.message and r.doc and FIX[r.code]
    assert len({r.name for r in RULES}) == len(RULES)


def test_shared_codes_match_check_and_runtime_codes_are_free():
    from tputool.rules.catalogue import all_rules

    check = all_rules()
    for r in RULES:
        if r.code.startswith("TPU6"):
            assert check[r.code].name == r.name
            assert check[r.code].patterns == r.patterns
        else:
            assert r.code not in check, f"{r.code} is also a check rule"
