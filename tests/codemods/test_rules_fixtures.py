"""Every fixtures/rules/ pair: expected output (safe and --unsafe-fixes), expected findings, idempotence."""

from __future__ import annotations

import libcst as cst
import pytest

from tests.codemods.rules_fixtures import load_fixtures
from tputool.codemods.python import PYTHON_TRIGGERS, port_python
from tputool.rules.model import FixSafety, Settings
from tputool.rules.port import RULES

FIXTURES = load_fixtures()
IDS = [f.name for f in FIXTURES]


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_fixture(fx, unsafe: bool) -> None:
    settings = Settings(unsafe_fixes=unsafe)
    out, findings = port_python(fx.source, fx.name + ".py", settings)
    expected = fx.out if fx.out is not None else fx.source
    if unsafe and fx.unsafe_out is not None:
        expected = fx.unsafe_out
    assert out == expected
    assert {(f.line, f.code) for f in findings} == fx.expected(unsafe)
    for f in findings:
        fix = RULES[f.code].fix
        safe_here = fix is FixSafety.SAFE or f.extra.get("fix") == "safe here"
        assert f.fixed is (f.fixable and (safe_here or unsafe)), f
        assert f.fixable is (f.fixable and fix is not FixSafety.NONE)
    # the output parses, and porting it again changes nothing and fixes nothing
    cst.parse_module(out)
    again, findings2 = port_python(out, fx.name + ".py", settings)
    assert again == out
    assert not [f for f in findings2 if f.fixed]


@pytest.mark.parametrize("fx", FIXTURES, ids=IDS)
def test_fixture_input_has_a_trigger(fx) -> None:
    data = fx.source.encode()
    assert any(t in data for t in PYTHON_TRIGGERS)


def test_expected_findings_include_the_fixture_rule() -> None:
    for fx in FIXTURES:
        assert fx.code in {c for _, c in fx.expected()}, fx.name
