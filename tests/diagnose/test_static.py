"""diagnose's static side: check's findings for the script, merged with (not duplicating) runtime findings."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from tests.diagnose.conftest import FIXTURES
from tputool.diagnose import diagnose
from tputool.diagnose.model import Finding
from tputool.diagnose.static import merge
from tputool.rules import catalogue as registry
from tputool.rules.model import Finding as CheckFinding
from tputool.rules.model import Severity


@pytest.fixture
def stand_in_rules(monkeypatch):
    """A one-rule Python porter (flags `.item()` as TPU601, row 76) in place of check's real rules."""
    importlib.import_module("tputool.rules.port")
    mod = types.ModuleType("tputool.codemods.python")

    def port_python(source, path, settings):
        found = [CheckFinding(path, i, line.index(".item()") + 1, "TPU601", "host sync inside a loop",
                              Severity.INFO) for i, line in enumerate(source.splitlines(), 1) if ".item()" in line]
        return source, found

    mod.port_python, mod.PYTHON_TRIGGERS = port_python, (b".item()",)
    monkeypatch.setitem(sys.modules, "tputool.codemods.python", mod)
    registry.all_rules.cache_clear()
    registry.python_codes.cache_clear()
    yield
    registry.all_rules.cache_clear()
    registry.python_codes.cache_clear()


def test_static_only_runs_check_rules_without_executing(stand_in_rules, tmp_path):
    p = tmp_path / "train.py"
    p.write_text("import torch\nraise SystemExit('must not run')\nfor _ in range(3):\n    torch.ones(1).item()\n")
    report = diagnose(str(p), static_only=True)
    assert report.status == "static" and report.note is None
    (f,) = report.findings
    assert (f.code, f.line, f.source, f.path) == ("TPU601", 4, "static", str(p))
    assert f.name == registry.all_rules()["TPU601"].name and f.fix


def test_runtime_finding_covers_static_one_at_same_line():
    rt = Finding(path="/u/t.py", line=5, col=0, code="TPU601", message="m", severity=Severity.WARNING, name="host-sync-in-loop", fix="f", count=4, per_step=1.0, source="runtime")
    same = Finding(path="/u/t.py", line=5, col=0, code="TPU601", message="m", severity=Severity.INFO, name="host-sync-in-loop", fix="f", source="static",
                   extra={"patterns": [76]})
    other = Finding(path="/u/t.py", line=2, col=0, code="TPU101", message="m", severity=Severity.WARNING, name="cuda-method-call", fix="f", source="static",
                    extra={"patterns": [1]})
    assert merge([rt], [same, other]) == [rt, other]


def test_static_real_rules_find_the_loop_item_in_the_host_sync_fixture():
    report = diagnose(str(FIXTURES / "host_sync.py"), static_only=True)
    assert ("TPU601", 16) in {(f.code, f.line) for f in report.findings}


def test_custom_op_fallback_covers_static_custom_op_finding():
    from tputool.diagnose.analyze import findings_from_record
    from tputool.diagnose.record import RunRecord

    ev = {"kind": "fallback", "detail": "ns.op.default", "file": "/u/t.py", "line": 7, "count": 4, "amount": 4,
          "late": 2, "late_amount": 2}
    (rt,) = findings_from_record(RunRecord.from_dict({"script": "/u/t.py", "argv": [], "status": "ok", "steps": 4,
                                                      "events": [ev]}))
    static = Finding(path="/u/t.py", line=7, col=0, code="TPU502", message="m", severity=Severity.ERROR, name="custom-op", fix="f", source="static",
                     extra={"patterns": [62]})
    assert merge([rt], [static]) == [rt]


def test_unsafe_only_fix_says_unsafe_fixes(tmp_path):
    p = tmp_path / "train.py"
    p.write_text("import torch\n\nd = torch.device('cuda')\nif d.type == 'cuda':\n    x = torch.cuda.is_available()\n"
                 "y = torch.ones(2).cuda()\n")
    fixes = {f.code: f.fix for f in diagnose(str(p), static_only=True).findings}
    assert registry.all_rules()["TPU109"].fix.value == "unsafe"
    assert "--unsafe-fixes" in fixes["TPU109"]
    safe = [code for code, fix in fixes.items() if "port --write" in fix and registry.all_rules()[code].fix.value == "safe"]
    assert safe and all("--unsafe-fixes" not in fixes[c] for c in safe)
