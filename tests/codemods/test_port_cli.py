"""`tputool port` through the CLI: diff output, --write round trips, encodings, failures, idempotence."""

from __future__ import annotations

import json
import os
import re
import stat

import pytest

from tests.codemods.helpers import TRAIN, invoke, write
from tputool.codemods import writer


def test_port_prints_git_style_diff_and_summary(tmp_path):
    write(tmp_path, "pkg/train.py", TRAIN)
    write(tmp_path, "pkg/clean.py", "import os\n")
    res = invoke("port", "pkg", cwd=tmp_path)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "--- a/pkg/train.py\n+++ b/pkg/train.py\n" in out
    assert "-model = torch.nn.Linear(2, 2).cuda()" in out
    assert '+x = torch.ones(2).to("tpu")' in out
    assert "files scanned" in out and "skipped by pre-filter" in out
    assert "pkg/train.py:3:" in out  # the findings list
    assert (tmp_path / "pkg/train.py").read_text() == TRAIN  # nothing written without --write


def test_port_quiet_prints_only_an_applicable_patch(tmp_path):
    write(tmp_path, "t.py", TRAIN)
    res = invoke("port", "-q", "t.py", cwd=tmp_path)
    assert res.stdout.startswith("--- a/t.py\n+++ b/t.py\n@@")
    assert "files scanned" not in res.stdout


def test_write_round_trip_and_idempotence(tmp_path):
    p = write(tmp_path, "t.py", TRAIN)
    os.chmod(p, 0o750)
    res = invoke("port", "--write", str(tmp_path))
    assert res.exit_code == 0, res.output
    new = p.read_text()
    assert ".cuda()" not in new and 'to("tpu")' in new
    assert stat.S_IMODE(os.stat(p).st_mode) == 0o750
    again = invoke("port", str(tmp_path))
    assert "+++ " not in again.stdout  # porting twice changes nothing
    assert invoke("port", "--write", str(tmp_path)).exit_code == 0
    assert p.read_text() == new


def test_write_keeps_crlf_bom_and_latin1_cookie(tmp_path):
    crlf = write(tmp_path, "crlf.py", TRAIN.replace("\n", "\r\n").encode())
    bom = write(tmp_path, "bom.py", b"\xef\xbb\xbf" + TRAIN.encode() + "s = 'h\u00e9'\n".encode("utf-8"))
    latin = write(tmp_path, "latin.py",
                  b"# -*- coding: latin-1 -*-\n" + TRAIN.encode() + "s = 'caf\u00e9'\n".encode("latin-1"))
    res = invoke("port", "--write", str(tmp_path))
    assert res.exit_code == 0, res.output
    c = crlf.read_bytes()
    assert b".cuda()" not in c and c.count(b"\r\n") == TRAIN.count("\n") and b"\n" not in c.replace(b"\r\n", b"")
    b = bom.read_bytes()
    assert b.startswith(b"\xef\xbb\xbf") and b.count(b"\xef\xbb\xbf") == 1 and b.rstrip().endswith("h\u00e9'".encode())
    assert b".cuda()" not in b
    lat = latin.read_bytes()
    assert b".cuda()" not in lat and lat.rstrip().endswith("caf\u00e9'".encode("latin-1"))
    assert invoke("port", str(tmp_path)).stdout.count("+++ ") == 0


def test_unparsable_file_is_reported_and_untouched(tmp_path):
    bad = write(tmp_path, "bad.py", "x = y.cuda(\n")
    good = write(tmp_path, "good.py", TRAIN)
    res = invoke("port", "--write", str(tmp_path))
    assert res.exit_code == 1
    assert bad.read_text() == "x = y.cuda(\n"
    assert ".cuda()" not in good.read_text()  # the other files are still ported
    assert "TPU900" in res.stdout and "bad.py" in res.stderr and "Traceback" not in res.output


def test_report_json_lists_changes_and_findings(tmp_path):
    write(tmp_path, "t.py", TRAIN)
    write(tmp_path, "launch.sh", "export CUDA_VISIBLE_DEVICES=0\n")
    rep = tmp_path / "r.json"
    res = invoke("port", str(tmp_path), "--report", str(rep))
    assert res.exit_code == 0
    doc = json.loads(rep.read_text())
    assert doc["command"] == "port" and doc["summary"]["changed"] == 1
    changed = [f for f in doc["files"] if f["status"] == "changed"]
    assert len(changed) == 1 and changed[0]["diff"].startswith("--- a/")
    codes = {f["code"] for f in doc["findings"]}
    assert "TPU901" in codes and any(f["fixed"] for f in doc["findings"])


def test_atomic_write_failure_leaves_original_and_no_temp(tmp_path, monkeypatch):
    p = write(tmp_path, "t.py", TRAIN)

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer.os, "replace", boom)
    res = invoke("port", "--write", str(tmp_path))
    assert res.exit_code == 1
    assert p.read_text() == TRAIN
    assert sorted(x.name for x in tmp_path.iterdir()) == ["t.py"]
    assert "cannot write" in res.stderr


def test_file_modified_during_port_is_not_overwritten(tmp_path, monkeypatch):
    from tputool.codemods import engine

    p = write(tmp_path, "t.py", TRAIN)
    real_run = engine.run

    def run_then_edit(*a, **k):
        result = real_run(*a, **k)
        p.write_text(TRAIN + "# edited meanwhile\n")
        return result

    monkeypatch.setattr(engine, "run", run_then_edit)
    res = invoke("port", "--write", str(tmp_path))
    assert res.exit_code == 1 and "changed on disk" in res.stderr
    assert p.read_text().endswith("# edited meanwhile\n")


@pytest.mark.parametrize("args,needle", [
    (("port", "/no/such/path"), "path does not exist"),
    (("port", ".", "--select", "XYZ1"), "unknown rule code"),
    (("port", ".", "--ignore", "TPU999"), "unknown rule code"),
    (("port", ".", "--config", "/no/such.toml"), "config file does not exist"),
    (("check", ".", "--format", "xml"), "--format must be one of"),
    (("check", ".", "--fail-on", "fatal"), "fail-on must be"),
    (("rules", "TPU999"), "unknown rule"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, args, needle):
    res = invoke(*args, cwd=tmp_path)
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: ") and needle in res.stderr
    assert "Traceback" not in res.output


def test_rules_lists_every_rule_and_prints_docs():
    from tputool.rules.catalogue import all_rules

    res = invoke("rules")
    assert res.exit_code == 0
    for code in all_rules():
        assert code in res.stdout
    assert "TPU901" in res.stdout and "cuda-visible-devices" in res.stdout
    doc = invoke("rules", "tpu912")
    assert doc.exit_code == 0 and "fp16-config" in doc.stdout and "bf16" in doc.stdout


def test_rules_also_lists_diagnose_rules():
    from tputool.rules.catalogue import listed_rules

    diag = [code for code, (_, cmd) in listed_rules().items() if cmd == "diagnose"]
    assert diag, "diagnose's TPU8xx rules are missing from `tputool rules`"
    res = invoke("rules")
    assert all(code in res.stdout for code in diag)
    assert invoke("rules", diag[0]).exit_code == 0


UNSAFE_SRC = 'import torch\n\n\ndef f(kind):\n    if kind == "cuda":\n        return torch.ones(2).cuda()\n'


def test_unsafe_fixes_flag_and_config(tmp_path):
    write(tmp_path, "a.py", UNSAFE_SRC)
    safe = invoke("port", "-q", ".", cwd=tmp_path).stdout
    unsafe = invoke("port", "-q", "--unsafe-fixes", ".", cwd=tmp_path).stdout
    assert '-    if kind == "cuda":' not in safe and '+    if kind == "tpu":' in unsafe
    tagged = invoke("port", ".", cwd=tmp_path).stdout
    assert re.search(r"a\.py:5:\d+: TPU\d+ \[unsafe-fix\] ", tagged)
    write(tmp_path, "pyproject.toml", "[tool.tputool]\nunsafe-fixes = true\n")
    assert invoke("port", "-q", ".", cwd=tmp_path).stdout == unsafe


def test_output_survives_an_ascii_only_stdout(monkeypatch):
    import io
    import sys

    from tputool.cli.port import _write

    buf = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buf, encoding="ascii"))
    _write('-s = "caf\u00e9"\n')
    sys.stdout.flush()
    assert buf.getvalue() == b'-s = "caf\\xe9"\n'
