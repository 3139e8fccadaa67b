"""Port public CUDA repositories (a development set nobody here wrote) and say what the port left behind.

Usage: python benchmarks/real_repos.py DIR [DIR ...] [--unsafe-fixes] [--show-missed N] [--json OUT]

Each DIR is an extracted repository (e.g. from `git archive` of nanoGPT, gpt-fast, pytorch-image-models,
pytorch/examples); nothing of theirs is committed here. For each one the script copies it to a temporary
directory, runs `tputool port --write` there (the default, safe fixes unless --unsafe-fixes), then prints:

  files      Python/config files scanned and changed by the port
  findings   the port's findings by code (and by class: AUTO fixed, REVIEW, BLOCKER)
  residuals  CUDA uses left in the ported code (a `cuda`/`nccl` name or attribute, a 'cuda'/'cuda:N'/'nccl'
             string), classed as *reported* (a finding of the port or of `check` on the ported tree sits on
             that line) or *missed* (nothing tells the user)
  idempotent whether a second port of the ported tree changes nothing
  check      `tputool check` on the ported tree at the default threshold: exit status and failing codes

Target: missed residuals 0 on every repository; a second port a no-op.
"""

from __future__ import annotations

import argparse
import collections
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

_CUDA_NAME = re.compile(r"^(cuda|nccl|cudnn|is_cuda)$")
_CUDA_STRING = re.compile(r"^(cuda(:\d*)?|nccl)$")
_CLI = [sys.executable, "-m", "tputool"]


def _tputool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*_CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=1800)


def residual_lines(path: Path) -> list[tuple[int, str]]:
    """(line, token) for each CUDA use left in one Python file's code.

    Comments and prose strings are not uses; neither are import statements (the names they bind are counted
    where they are used) nor the name of a user's own `def cuda(self)` method.
    """
    try:
        text = path.read_text(encoding="utf-8")
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (OSError, UnicodeDecodeError, tokenize.TokenError, SyntaxError):
        return []
    out = []
    first = None  # the first name of the current logical line
    prev = None
    for tok in tokens:
        if tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            if tok.type == tokenize.NEWLINE:
                first = None
            continue
        if first is None and tok.type not in (tokenize.COMMENT,):
            first = tok.string
        is_import = first in ("import", "from")
        if tok.type == tokenize.NAME and _CUDA_NAME.match(tok.string) and not is_import and prev != "def":
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and not is_import:
            body = tok.string.lstrip("rRbBuU")
            if body[:1] in "fF":
                body = body[1:]
            body = body.strip("'\"")
            if _CUDA_STRING.match(body) or body.startswith("cuda:{") or body.startswith("cuda:%"):
                out.append((tok.start[0], tok.string))
        if tok.type != tokenize.COMMENT:
            prev = tok.string
    return out


def _findings(report: str) -> list[dict]:
    try:
        doc = json.loads(report)
    except json.JSONDecodeError:
        return []
    return doc.get("findings", []) if isinstance(doc, dict) else []


def _rel(path: str, root: Path) -> str:
    p = Path(path)
    p = p if p.is_absolute() else root / p
    return os.path.relpath(os.path.normpath(p), root)


def study(repo: Path, unsafe: bool, show_missed: int) -> dict:
    """Port one repository in a temporary copy and measure what is left."""
    with tempfile.TemporaryDirectory(prefix="tputool-dev-") as tmp:
        work = Path(tmp) / repo.name
        shutil.copytree(repo, work, symlinks=True)
        flags = ["--unsafe-fixes"] if unsafe else []
        report = Path(tmp) / "port.json"
        wrote = _tputool("port", ".", "--write", "-q", "--report", str(report), *flags, cwd=work)
        port_findings = _findings(report.read_text()) if report.exists() else []
        report.unlink(missing_ok=True)
        _tputool("port", ".", "-q", "--report", str(report), *flags, cwd=work)
        second_changes = sum(1 for f in _findings(report.read_text()) if f.get("fixed")) if report.exists() else -1
        check = _tputool("check", ".", "--format", "json", cwd=work)
        check_findings = _findings(check.stdout)
        flagged: dict[str, set[int]] = collections.defaultdict(set)
        for f in port_findings + check_findings:
            flagged[_rel(f["path"], work)].add(int(f["line"]))
        reported, missed = 0, []
        for py in sorted(work.rglob("*.py")):
            if not py.is_file() or py.is_symlink():
                continue
            rel = _rel(str(py), work)
            for line, tok in residual_lines(py):
                if line in flagged.get(rel, ()):
                    reported += 1
                else:
                    missed.append(f"{rel}:{line}: {tok}")
        changed = {_rel(f["path"], work) for f in port_findings if f.get("fixed")}
        by_code = collections.Counter(f["code"] for f in port_findings)
        failing = collections.Counter(f["code"] for f in check_findings if f.get("severity") in ("warning", "error"))
        return {
            "repo": repo.name,
            "files_scanned": len([p for p in work.rglob("*") if p.is_file()]),
            "files_changed": len(changed),
            "write_status": wrote.returncode,
            "findings": dict(sorted(by_code.items())),
            "residual_reported": reported,
            "residual_missed": len(missed),
            "missed": missed[:show_missed],
            "second_port_noop": second_changes == 0,
            "check_exit": check.returncode,
            "check_failing": dict(sorted(failing.items())),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("repos", nargs="+", type=Path)
    ap.add_argument("--unsafe-fixes", action="store_true")
    ap.add_argument("--show-missed", type=int, default=20, help="list at most this many missed residuals")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    rows = []
    for repo in args.repos:
        if not repo.is_dir():
            print(f"error: {repo} is not a directory", file=sys.stderr)
            return 2
        r = study(repo.resolve(), args.unsafe_fixes, args.show_missed)
        rows.append(r)
        print(f"== {r['repo']}: {r['files_changed']} files changed; second port no-op: {r['second_port_noop']}")
        print(f"   findings: {sum(r['findings'].values())}  " + " ".join(f"{k}:{v}" for k, v in r["findings"].items()))
        print(f"   residual CUDA uses: reported {r['residual_reported']}, missed {r['residual_missed']}")
        for m in r["missed"]:
            print(f"     missed {m}")
        print(f"   check: exit {r['check_exit']}; failing " +
              (" ".join(f"{k}:{v}" for k, v in r["check_failing"].items()) or "none"))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r["residual_missed"] == 0 and r["second_port_noop"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
