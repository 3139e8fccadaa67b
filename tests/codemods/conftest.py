"""Fixtures for the port/check engine tests."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from tputool.codemods import registry
from tputool.codemods.model import (
    Finding,
    FixSafety,
    Rule,
    RuleClass,
    Severity,
    is_suppressed,
    suppressed_codes,
)


def _fake_modules() -> tuple[types.ModuleType, types.ModuleType]:
    import libcst

    rules_mod = types.ModuleType("tputool.codemods.rules_table")
    rules_mod.RULES = {
        "TPU101": Rule("TPU101", "cuda-method-call", ".cuda() call", Severity.WARNING, FixSafety.SAFE,
                       RuleClass.AUTO_NOTE, "doc"),
        "TPU102": Rule("TPU102", "float16", "float16 dtype", Severity.WARNING, FixSafety.UNSAFE, RuleClass.REVIEW,
                       "doc"),
    }
    py_mod = types.ModuleType("tputool.codemods.python")

    def port_python(source, path, settings):
        libcst.parse_module(source)
        out, findings = [], []
        for i, line in enumerate(source.splitlines(keepends=True), 1):
            sup = suppressed_codes(line)
            for code, old, new in (("TPU101", ".cuda()", '.to("tpu")'), ("TPU102", "torch.float16", "torch.bfloat16")):
                if old in line and settings.enabled(code) and not is_suppressed(code, sup):
                    fix = code == "TPU101" or settings.unsafe_fixes
                    findings.append(Finding(path, i, line.index(old) + 1, code, rules_mod.RULES[code].message,
                                            Severity.WARNING, fixed=fix, fixable=True))
                    if fix:
                        line = line.replace(old, new)
            out.append(line)
        return "".join(out), findings

    py_mod.port_python = port_python
    py_mod.PYTHON_TRIGGERS = (b"cuda", b"float16")
    return rules_mod, py_mod


@pytest.fixture(autouse=True)
def python_rules(monkeypatch):
    """Use the real Python rules when they exist, else a two-rule stand-in (TPU101 safe, TPU102 unsafe)."""
    try:
        importlib.import_module("tputool.codemods.rules_table")
        real = hasattr(importlib.import_module("tputool.codemods.python"), "port_python")
    except ImportError:
        real = False
    if not real:
        rules_mod, py_mod = _fake_modules()
        monkeypatch.setitem(sys.modules, "tputool.codemods.rules_table", rules_mod)
        monkeypatch.setitem(sys.modules, "tputool.codemods.python", py_mod)
    registry.all_rules.cache_clear()
    registry.python_codes.cache_clear()
    registry.listed_rules.cache_clear()
    yield real
    registry.all_rules.cache_clear()
    registry.python_codes.cache_clear()
    registry.listed_rules.cache_clear()
