"""port/check on hostile trees and input: special files, huge files, links, read-only files, broken config,
Ctrl-C, notebooks, .gitignore, standard input, and the CLI conventions users know from ruff."""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.codemods.helpers import TRAIN, invoke, write
from tputool.codemods import discover as disc
from tputool.codemods.config import ProjectConfig

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str, cwd: Path, timeout: float = 120, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """Run `python -m tputool ARGS` in a subprocess, with 2 GB of address space and a time limit."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tputool", *args], cwd=cwd, env=env, capture_output=True,
                          timeout=timeout, preexec_fn=limit, input=stdin)


# --- files that are not regular files ---------------------------------------------------------------------

def test_symlink_to_dev_zero_and_a_fifo_in_a_walk_are_skipped_fast(tmp_path):
    write(tmp_path, "train.py", TRAIN)
    os.symlink("/dev/zero", tmp_path / "zero.py")
    os.mkfifo(tmp_path / "p.py")
    t = time.monotonic()
    res = cli("check", ".", cwd=tmp_path, timeout=60)
    assert time.monotonic() - t < 60
    assert res.returncode == 1, res.stderr  # train.py's findings; the special files were not read
    err = res.stderr.decode()
    assert "zero.py: skipped: not a regular file" in err and "p.py: skipped: not a regular file" in err
    assert "train.py:3:" in res.stdout.decode() and "Traceback" not in err


@pytest.mark.parametrize("make", ["fifo", "dev"])
def test_a_special_file_named_on_the_command_line_is_a_usage_error(tmp_path, make):
    if make == "fifo":
        os.mkfifo(tmp_path / "p.py")
        target = "p.py"
    else:
        target = "/dev/zero"
    res = cli("check", target, cwd=tmp_path, timeout=60)
    err = res.stderr.decode()
    assert res.returncode == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert "not a regular file" in err


def test_a_fifo_swapped_in_after_discovery_is_not_opened_blocking(tmp_path):
    p = tmp_path / "p.py"
    os.mkfifo(p)
    with pytest.raises(disc.NotReadable, match="not a regular file"):
        disc.read_regular(str(p), 1024)
    big = write(tmp_path, "big.py", "x = 1\n" * 100)
    with pytest.raises(disc.NotReadable, match="too large"):
        disc.read_regular(str(big), 100)
    assert disc.read_regular(str(big), 600) == b"x = 1\n" * 100


# --- the size cap -------------------------------------------------------------------------------------------

def test_files_over_max_file_size_are_skipped_with_tpu940(tmp_path):
    write(tmp_path, "small.py", TRAIN)
    write(tmp_path, "gen.py", TRAIN * 2000)
    res = invoke("check", ".", "--max-file-size", "10K", "--fail-on", "error", cwd=tmp_path)
    assert "gen.py:1:1: TPU940 file is" in res.stdout and "small.py:3:" in res.stdout
    assert "gen.py:3:" not in res.stdout  # never read
    assert "1 file(s) skipped unread" in res.stdout
    write(tmp_path, "pyproject.toml", '[tool.tputool]\nmax-file-size = "1MB"\n')
    assert "TPU940" not in invoke("check", ".", cwd=tmp_path).stdout
    write(tmp_path, "pyproject.toml", '[tool.tputool]\nmax-file-size = 60\n')
    res = invoke("check", ".", "--format", "json", cwd=tmp_path)
    doc = json.loads(res.stdout)
    assert doc["summary"]["skipped"]["too_large"] == 2
    bad = invoke("check", ".", "--max-file-size", "lots", cwd=tmp_path)
    assert bad.exit_code == 2 and "max-file-size must be a positive size" in bad.stderr


def test_default_cap_is_one_megabyte():
    assert disc.DEFAULT_MAX_FILE_SIZE == 1024 * 1024 == ProjectConfig(root=Path(".")).max_file_size


# --- writing --------------------------------------------------------------------------------------------------

def test_write_refuses_a_read_only_file(tmp_path):
    ro = write(tmp_path, "ro.py", TRAIN)
    rw = write(tmp_path, "rw.py", TRAIN)
    os.chmod(ro, 0o444)
    res = invoke("port", "--write", ".", cwd=tmp_path)
    assert res.exit_code == 1 and "ro.py: file is read-only; not written" in res.stderr
    assert ro.read_text() == TRAIN and ".cuda()" not in rw.read_text()


def test_write_keeps_hard_links(tmp_path):
    a = write(tmp_path, "tree/a.py", TRAIN)
    outside = tmp_path / "elsewhere.py"
    os.link(a, outside)
    inside = tmp_path / "tree/b.py"
    os.link(a, inside)
    res = invoke("port", "--write", "tree", cwd=tmp_path)
    assert res.exit_code == 0, res.output
    assert "changed on disk" not in res.output
    assert ".cuda()" not in a.read_text() and outside.read_text() == a.read_text() == inside.read_text()
    assert os.stat(a).st_ino == os.stat(outside).st_ino and os.stat(a).st_nlink == 3
    assert sorted(p.name for p in (tmp_path / "tree").iterdir()) == ["a.py", "b.py"]  # no temp file left


def test_in_place_write_failure_restores_the_original(tmp_path, monkeypatch):
    from tputool.codemods import writer

    a = write(tmp_path, "a.py", TRAIN)
    os.link(a, tmp_path / "link.py")
    real_fsync = os.fsync
    calls = []

    def flaky_fsync(fd):
        calls.append(fd)
        if len(calls) == 2:  # the temp copy's fsync passes, the in-place one fails
            raise OSError(28, "No space left on device")
        return real_fsync(fd)

    monkeypatch.setattr(writer.os, "fsync", flaky_fsync)
    with pytest.raises(OSError):
        writer.write_in_place(str(a), b"new text\n", TRAIN.encode())
    assert a.read_text() == TRAIN and not [p for p in tmp_path.iterdir() if "tputool-tmp" in p.name]


def test_symlink_inside_the_tree_is_read_once_and_written_through(tmp_path):
    a = write(tmp_path, "a.py", TRAIN)
    os.symlink("a.py", tmp_path / "alias.py")
    res = invoke("port", "--write", ".", cwd=tmp_path)
    assert res.exit_code == 0, res.output
    assert "changed on disk" not in res.output and "alias.py" not in res.output
    assert (tmp_path / "alias.py").is_symlink() and ".cuda()" not in a.read_text()


def test_symlink_to_a_file_outside_the_tree_is_read_but_not_written_through(tmp_path):
    outside = write(tmp_path, "shared/common.py", TRAIN)
    write(tmp_path, "proj/own.py", TRAIN)
    os.symlink(outside, tmp_path / "proj/common.py")
    shown = invoke("port", "proj", cwd=tmp_path)
    assert "+++ b/proj/common.py" in shown.stdout  # read and reported
    res = invoke("port", "--write", "proj", cwd=tmp_path)
    assert res.exit_code == 1 and "outside the scanned paths; not written" in res.stderr
    assert outside.read_text() == TRAIN and ".cuda()" not in (tmp_path / "proj/own.py").read_text()


def test_bad_report_path_fails_before_anything_is_written(tmp_path):
    a = write(tmp_path, "a.py", TRAIN)
    res = invoke("port", "--write", ".", "--report", str(tmp_path / "no/such/dir/r.json"), cwd=tmp_path)
    assert res.exit_code == 2 and res.stderr.startswith("error: --report") and "does not exist" in res.stderr
    assert a.read_text() == TRAIN
    out = invoke("check", ".", "-o", str(tmp_path), cwd=tmp_path)
    assert out.exit_code == 2 and "is a directory" in out.stderr


# --- configuration ------------------------------------------------------------------------------------------

def test_an_invalid_discovered_pyproject_is_an_error(tmp_path):
    write(tmp_path, "pyproject.toml", "[project\nname = 'x'\n")
    write(tmp_path, "a.py", TRAIN)
    res = invoke("check", ".", cwd=tmp_path)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "pyproject.toml: invalid TOML" in res.stderr


# --- Ctrl-C ------------------------------------------------------------------------------------------------

_SLOW = """
import sys, time
from tputool.codemods import engine
real = engine.analyze
def slow(*a, **k):
    print("started", flush=True)
    time.sleep(0.2)
    return real(*a, **k)
engine.analyze = slow
sys.argv = ["tputool"] + sys.argv[1:]
from tputool.cli import main
main()
"""


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_says_interrupted_without_a_traceback(tmp_path, jobs):
    for i in range(40):
        write(tmp_path, f"m{i}.py", TRAIN * 20)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # (preexec: Ctrl-C handled as in a terminal even when pytest was started with SIGINT ignored, e.g. by `cmd &`)
    proc = subprocess.Popen([sys.executable, "-c", _SLOW, "port", "--write", "-j", jobs, "."], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline() == b"started\n" or jobs == "2"
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"Traceback" not in err and err.decode().startswith("interrupted")
    assert b"no file written" in err


def test_interrupt_during_writes_lists_the_files_written(tmp_path, monkeypatch):
    from tputool.codemods import writer

    for name in ("a.py", "b.py", "c.py"):
        write(tmp_path, name, TRAIN)
    real = writer.write_atomic
    calls = []

    def write_then_interrupt(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(writer, "write_atomic", write_then_interrupt)
    res = invoke("port", "--write", "-j", "1", ".", cwd=tmp_path)
    assert res.exit_code == 130
    assert "interrupted; 1 file(s) already written:" in res.stderr and "  a.py" in res.stderr
    assert (tmp_path / "b.py").read_text() == TRAIN


# --- output order and progress ----------------------------------------------------------------------------

def test_port_prints_the_summary_after_the_findings(tmp_path):
    write(tmp_path, "a.py", TRAIN)
    out = invoke("port", ".", cwd=tmp_path).stdout
    assert out.index("a.py:3:") < out.index("files scanned")


def test_check_progress_only_with_verbose_off_a_terminal(tmp_path):
    write(tmp_path, "a.py", TRAIN)
    quiet = invoke("check", ".", cwd=tmp_path)
    assert quiet.stderr == ""
    loud = invoke("check", "-v", ".", cwd=tmp_path)
    assert "checking: 1/1 files" in loud.stderr


def test_a_run_over_no_files_says_so(tmp_path):
    write(tmp_path, "notes.txt", "hello\n")
    for cmd in ("port", "check"):
        res = invoke(cmd, ".", cwd=tmp_path)
        assert res.exit_code == 0
        assert "warning: no Python or config files found under ." in res.stderr


# --- notebooks ----------------------------------------------------------------------------------------------

def _notebook(cells: list[tuple[str, object]]) -> dict:
    return {
        "cells": [{"cell_type": kind, "execution_count": None, "id": f"c{i}", "metadata": {"tags": ["x"]},
                   "outputs": [], "source": src} if kind == "code" else
                  {"cell_type": kind, "id": f"c{i}", "metadata": {}, "source": src}
                  for i, (kind, src) in enumerate(cells)],
        "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5,
    }


def test_notebook_code_cells_are_ported_and_layout_kept(tmp_path):
    nb = _notebook([
        ("markdown", ["# Train on `cuda`\n"]),
        ("code", ["%matplotlib inline\n", "import torch\n", "!nvidia-smi"]),
        ("code", "model = torch.nn.Linear(2, 2).cuda()\nx = torch.ones(2).to('cuda')"),
        ("code", ["%%bash\n", "echo cuda\n"]),
    ])
    text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
    p = write(tmp_path, "train.ipynb", text)
    res = invoke("check", ".", cwd=tmp_path)
    assert re.search(r"train\.ipynb:cell 3:1:\d+: TPU", res.stdout), res.stdout
    assert invoke("port", "--write", ".", cwd=tmp_path).exit_code == 0
    new = p.read_text()
    doc = json.loads(new)
    assert new == json.dumps(doc, indent=1, ensure_ascii=False) + "\n"  # same layout
    assert doc["cells"][0] == nb["cells"][0] and doc["cells"][3] == nb["cells"][3]
    assert doc["cells"][1]["source"] == nb["cells"][1]["source"]  # magics kept
    cell = doc["cells"][2]["source"]
    assert isinstance(cell, str) and ".cuda()" not in cell and "'cuda'" not in cell and not cell.endswith("\n")
    assert doc["cells"][2]["metadata"] == {"tags": ["x"]} and doc["metadata"] == nb["metadata"]
    assert invoke("port", ".", cwd=tmp_path).stdout.count("+++ ") == 0


def test_notebook_syntax_error_names_the_cell(tmp_path):
    write(tmp_path, "bad.ipynb", json.dumps(_notebook([("code", "import torch\n"), ("code", "x = (torch.cuda\n")])))
    res = invoke("check", ".", cwd=tmp_path)
    assert "bad.ipynb:cell 2:" in res.stdout and "TPU900" in res.stdout and "syntax error in cell 2" in res.stdout
    write(tmp_path, "bad.ipynb", "{not json: torch.cuda")
    assert "invalid notebook JSON" in invoke("check", ".", cwd=tmp_path).stdout


# --- .gitignore ---------------------------------------------------------------------------------------------

def test_gitignore_is_honoured_in_walks(tmp_path):
    write(tmp_path, ".gitignore", "gen/\n*_pb2.py\n/top.py\n!keep_pb2.py\nlogs/**/*.py\n# comment\n")
    for rel in ("a.py", "gen/g.py", "x_pb2.py", "keep_pb2.py", "top.py", "sub/top.py", "logs/a/b/c.py",
                "sub/.gitignore", "sub/local.py", "sub/deep/local.py", "sub/other.py"):
        write(tmp_path, rel, "local.py\n" if rel.endswith(".gitignore") else TRAIN)
    files = {Path(f.path).relative_to(tmp_path).as_posix() for f in disc.discover([str(tmp_path)], tmp_path)}
    assert files == {"a.py", "keep_pb2.py", "sub/top.py", "sub/other.py"}
    named = disc.discover([str(tmp_path / "gen/g.py")], tmp_path)  # a file named explicitly is scanned
    assert [Path(f.path).name for f in named] == ["g.py"]


# --- CLI conventions ----------------------------------------------------------------------------------------

def test_diff_prints_only_the_diff_and_exits_1_when_something_would_change(tmp_path):
    a = write(tmp_path, "a.py", TRAIN)
    res = invoke("port", "--diff", ".", cwd=tmp_path)
    assert res.exit_code == 1 and res.stdout.startswith("--- a/a.py") and "files scanned" not in res.stdout
    assert a.read_text() == TRAIN
    assert invoke("port", "--diff", "--exit-zero", ".", cwd=tmp_path).exit_code == 0
    write(tmp_path, "a.py", "import os\n")
    assert invoke("port", "--diff", ".", cwd=tmp_path).exit_code == 0
    assert invoke("port", "--diff", "--write", ".", cwd=tmp_path).exit_code == 2


def test_check_exit_zero_and_quiet(tmp_path):
    write(tmp_path, "a.py", TRAIN)
    assert invoke("check", ".", cwd=tmp_path).exit_code == 1
    res = invoke("check", "--exit-zero", "-q", ".", cwd=tmp_path)
    assert res.exit_code == 0 and "a.py:3:" in res.stdout and "finding(s) in" not in res.stdout


def test_stdin_port_prints_the_ported_source_and_check_reports(tmp_path):
    res = cli("port", "-", "--stdin-filename", "train.py", cwd=tmp_path, stdin=TRAIN.encode())
    assert res.returncode == 0, res.stderr
    out = res.stdout.decode()
    assert out.startswith("import torch") and ".cuda()" not in out and 'to("tpu")' in out
    assert "train.py:3:" in res.stderr.decode()
    same = cli("port", "-", cwd=tmp_path, stdin=b"import os\n")
    assert same.stdout == b"import os\n"
    diff = cli("port", "--diff", "-", cwd=tmp_path, stdin=TRAIN.encode())
    assert diff.returncode == 1 and diff.stdout.decode().startswith("--- a/-")
    chk = cli("check", "-", "--stdin-filename", "t.py", cwd=tmp_path, stdin=TRAIN.encode())
    assert chk.returncode == 1 and "t.py:3:" in chk.stdout.decode()
    assert list(tmp_path.iterdir()) == []


def test_rules_format_json():
    from tputool.rules.catalogue import listed_rules

    doc = json.loads(invoke("rules", "--format", "json").stdout)
    assert [r["code"] for r in doc] == list(listed_rules())
    assert {"code", "name", "class", "fix", "severity", "reported_by", "doc"} <= set(doc[0])
    one = json.loads(invoke("rules", "TPU940", "--format", "json").stdout)
    assert one["name"] == "file-too-large" and one["severity"] == "info"


@pytest.mark.parametrize("command", ["port", "check", "tune", "diagnose", "rules"])
def test_help_has_no_python_type_names(command):
    out = invoke(command, "--help").stdout
    assert not re.search(r"<(?:bool|str|int|float|path|list\[\w+\])>", out), out
    assert "0.3333" not in out


@pytest.mark.parametrize("args,needle", [
    (("port", "--bogus"), "no such option: --bogus"),
    (("check", "--jobs", "x"), "invalid value for --jobs"),
    (("check", "--format", "xml"), "--format must be one of text, json, sarif, github"),
    (("rules", "--format", "yaml"), "--format must be one of text, json"),
])
def test_usage_errors_are_one_line_like_user_errors(tmp_path, args, needle):
    res = invoke(*args, cwd=tmp_path)
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: ") and needle in res.stderr, res.stderr


# --- port time grows about linearly: the diff of a big file ----------------------------------------------

def _apply(old: str, diff: str) -> str:
    """Apply a unified diff to `old` (enough of patch(1) for the tests)."""
    a, out, i = old.splitlines(keepends=True), [], 0
    lines = diff.splitlines(keepends=True)[2:]
    k = 0
    while k < len(lines):
        m = re.match(r"@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", lines[k])
        start = int(m.group(1)) - (0 if m.group(2) == "0" else 1)
        out += a[i:start]
        i = start
        k += 1
        while k < len(lines) and not lines[k].startswith("@@"):
            tag, text = lines[k][0], lines[k][1:]
            if k + 1 < len(lines) and lines[k + 1].startswith("\\"):
                text = text[:-1]
                k += 1
            if tag in " -":
                assert a[i] == text
                i += 1
            if tag in " +":
                out.append(text)
            k += 1
    return "".join(out + a[i:])


def test_diff_of_random_edits_applies_back():
    import random

    from tputool.codemods.engine import unified_diff

    rng = random.Random(7)
    for trial in range(200):
        old = [rng.choice(["a\n", "b\n", "c\n", f"u{rng.random()}\n", "x = 1\n"]) for _ in range(rng.randint(0, 40))]
        new = list(old)
        for _ in range(rng.randint(1, 6)):
            op, at = rng.random(), rng.randint(0, len(new))
            if op < 0.4 and at < len(new):
                del new[at]
            elif op < 0.7:
                new.insert(at, rng.choice(["a\n", "n\n", f"v{trial}\n"]))
            elif at < len(new):
                new[at] = "changed\n"
        old_s, new_s = "".join(old), "".join(new).rstrip("\n") if trial % 5 == 0 else "".join(new)
        d = unified_diff(old_s, new_s, "f.py")
        assert (d == "") == (old_s == new_s)
        if d:
            assert d.startswith("--- a/f.py\n+++ b/f.py\n@@ ")
            assert _apply(old_s, d) == new_s


def test_diff_of_a_big_evenly_changed_file_is_fast():
    from tputool.codemods.engine import unified_diff

    old = "".join(f"def f_{i}(m):\n    m = m.cuda()\n    return m\n" for i in range(10000))  # 330 KB
    new = old.replace("m.cuda()", "m.to('tpu')")
    t = time.monotonic()
    d = unified_diff(old, new, "gen.py")
    assert time.monotonic() - t < 10  # difflib alone: over 100 s
    assert d.count("\n-    m = m.cuda()") == 10000 and _apply(old, d) == new


def test_no_cyclic_gc_while_a_file_is_rewritten(tmp_path, monkeypatch):
    import gc

    from tputool.codemods import engine

    seen = []
    port_python, triggers, parse_error = engine.python_backend()

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return port_python(*a, **k)

    monkeypatch.setattr(engine, "python_backend", lambda: (spy, triggers, parse_error))
    write(tmp_path, "a.py", TRAIN)
    result = engine.run([str(tmp_path)], ProjectConfig(root=tmp_path), jobs=1)
    assert result.files[0].status == engine.CHANGED
    assert seen == [False] and gc.isenabled()  # full collections walked every CST node: quadratic time
