"""`tputool check`: exit codes, the four output formats, --changed-since, --statistics, config files."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from tests.codemods.helpers import TRAIN, invoke, write


@pytest.fixture
def repo(tmp_path):
    write(tmp_path, "train.py", TRAIN)
    write(tmp_path, "launch.sh", "export CUDA_VISIBLE_DEVICES=0\nexport NCCL_DEBUG=INFO\n")
    write(tmp_path, "requirements.txt", "torch\nbitsandbytes>=0.41\n")
    return tmp_path


def test_exit_codes_follow_fail_on(tmp_path):
    write(tmp_path, "launch.sh", "export NCCL_DEBUG=INFO\n")  # one info finding
    assert invoke("check", str(tmp_path)).exit_code == 0  # default fail-on: warning
    assert invoke("check", str(tmp_path), "--fail-on", "info").exit_code == 1
    write(tmp_path, "launch.sh", "export CUDA_VISIBLE_DEVICES=0\n")  # a warning
    assert invoke("check", str(tmp_path)).exit_code == 1
    assert invoke("check", str(tmp_path), "--fail-on", "error").exit_code == 0
    write(tmp_path, "launch.sh", "echo hi\n")
    res = invoke("check", str(tmp_path), "--fail-on", "info")
    assert res.exit_code == 0 and "passed" in res.stdout


def test_check_never_writes(repo):
    res = invoke("check", str(repo))
    assert res.exit_code == 1
    assert (repo / "train.py").read_text() == TRAIN
    assert re.search(r"train\.py:3:\d+: TPU\d+ \[\*\] ", res.stdout)  # fixable by `tputool port`
    assert "FAILED" in res.stdout


def test_json_format(repo):
    res = invoke("check", str(repo), "--format", "json")
    doc = json.loads(res.stdout)
    assert doc["command"] == "check" and doc["failed"] is True and doc["fail_on"] == "warning"
    codes = {f["code"] for f in doc["findings"]}
    assert {"TPU901", "TPU902", "TPU920"} <= codes
    assert all({"path", "line", "col", "severity", "class"} <= f.keys() for f in doc["findings"])
    assert doc["statistics"]["TPU920"] == 1


def test_sarif_format(repo):
    from tputool.rules.catalogue import all_rules

    res = invoke("check", str(repo), "--format", "sarif")
    log = json.loads(res.stdout)
    assert log["version"] == "2.1.0" and len(log["runs"]) == 1
    run = log["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == list(all_rules())
    assert run["results"]
    for r in run["results"]:
        assert rules[r["ruleIndex"]]["id"] == r["ruleId"]
        assert r["level"] in ("error", "warning", "note")
        loc = r["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uri"] and loc["region"]["startLine"] >= 1
        assert loc["region"]["startColumn"] >= 1


def test_github_format(repo):
    res = invoke("check", "--format", "github", ".", cwd=repo)
    lines = res.stdout.splitlines()
    assert lines
    pat = re.compile(r"^::(error|warning|notice) file=[^,]+,line=\d+,col=\d+,title=TPU\d{3}::\S.*$")
    assert all(pat.match(line) for line in lines), lines
    assert "::error file=requirements.txt,line=2,col=1,title=TPU920::" in res.stdout


def test_statistics_and_output_file(repo):
    out = repo / "report.txt"
    res = invoke("check", str(repo), "--statistics", "-o", str(out))
    assert res.stdout == ""
    text = out.read_text()
    assert re.search(r"^\s+1  TPU920  bitsandbytes-dependency$", text, re.M)


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t", "HOME": str(cwd), "PATH": "/usr/bin:/bin"})


def test_changed_since_scans_only_changed_and_untracked(tmp_path):
    write(tmp_path, "old.py", TRAIN)
    write(tmp_path, "edited.sh", "echo hi\n")
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "base")
    write(tmp_path, "edited.sh", "export CUDA_VISIBLE_DEVICES=1\n")
    write(tmp_path, "new.py", TRAIN)
    res = invoke("check", ".", "--changed-since", "main", "--format", "json", cwd=tmp_path)
    paths = {f["path"] for f in json.loads(res.stdout)["files"]}
    assert paths == {"edited.sh", "new.py"}
    bad = invoke("check", ".", "--changed-since", "no-such-ref", cwd=tmp_path)
    assert bad.exit_code == 2 and bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1


def test_changed_since_outside_git_is_a_user_error(tmp_path):
    write(tmp_path, "a.py", TRAIN)
    res = invoke("check", str(tmp_path), "--changed-since", "HEAD")
    assert res.exit_code == 2 and "not inside a git repository" in res.stderr


def test_config_select_ignore_per_file_ignores_exclude(repo):
    write(repo, "tests/test_x.py", TRAIN)
    write(repo, "legacy/old.sh", "export CUDA_VISIBLE_DEVICES=0\n")
    write(repo, "pyproject.toml", """
[tool.tputool]
ignore = ["TPU902"]
per-file-ignores = {"tests/*" = ["TPU"]}
exclude = ["legacy"]
fail-on = "error"
""")
    doc = json.loads(invoke("check", str(repo / "train.py"), str(repo / "launch.sh"), str(repo / "tests"),
                            str(repo / "legacy"), "--format", "json").stdout)
    codes_by_file = {f["path"].rsplit("/", 1)[-1]: {x["code"] for x in f["findings"]} for f in doc["files"]}
    assert "old.sh" not in codes_by_file  # excluded
    assert codes_by_file["launch.sh"] == {"TPU901"}  # TPU902 ignored
    assert codes_by_file["test_x.py"] == set()  # per-file-ignores
    assert codes_by_file["train.py"]
    assert doc["fail_on"] == "error" and doc["config"].endswith("pyproject.toml")
    sel = json.loads(invoke("check", str(repo), "--select", "TPU92", "--format", "json").stdout)
    assert {f["code"] for f in sel["findings"]} == {"TPU920"}


@pytest.mark.parametrize("body,needle", [
    ("[tool.tputool]\nselect = [\n", "invalid TOML"),
    ("[tool.tputool]\nselcet = ['TPU1']\n", "unknown key 'selcet'"),
    ("[tool.tputool]\nignore = 'TPU1'\n", "must be a list"),
    ("[tool.tputool]\nfail-on = 'fatal'\n", "fail-on must be"),
    ("[tool.tputool]\nignore = ['CUDA1']\n", "unknown rule code"),
])
def test_bad_config_is_one_line(tmp_path, body, needle):
    write(tmp_path, "pyproject.toml", body)
    write(tmp_path, "a.sh", "echo\n")
    res = invoke("check", str(tmp_path))
    assert res.exit_code == 2 and needle in res.stderr and res.stderr.count("\n") == 1


def test_explicit_config_file(tmp_path):
    write(tmp_path, "a.sh", "export CUDA_VISIBLE_DEVICES=0\n")
    cfg = write(tmp_path, "conf/tputool.toml", "ignore = ['TPU901']\n")
    assert invoke("check", str(tmp_path), "--config", str(cfg)).exit_code == 0


def test_pre_commit_hooks_file():
    from pathlib import Path

    hooks = yaml.safe_load((Path(__file__).parents[2] / ".pre-commit-hooks.yaml").read_text())
    by_id = {h["id"]: h for h in hooks}
    assert by_id["tputool-check"]["entry"] == "tputool check"
    assert "--write" in by_id["tputool-port"]["entry"]
    assert all(h["language"] == "python" and "python" in h["types_or"] for h in hooks)
