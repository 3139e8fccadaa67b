"""Render a RunResult: diffs, the summary table, finding lines, JSON, SARIF 2.1.0, GitHub annotations."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from tputool import __version__
from tputool.codemods.discover import NOT_REGULAR, TOO_LARGE
from tputool.codemods.engine import CHANGED, ERROR, PREFILTERED, SKIPPED, UNPARSABLE, RunResult
from tputool.rules.catalogue import all_rules
from tputool.rules.model import Finding, Rule, Severity

_SEVERITIES = (Severity.ERROR, Severity.WARNING, Severity.INFO)
_CLASSES = ("AUTO", "AUTO+N", "REVIEW", "BLOCKER")


def _rule(code: str) -> Rule | None:
    return all_rules().get(code)


def summary(result: RunResult) -> dict[str, Any]:
    """Counts for the summary table and the JSON report."""
    files = result.files
    findings = result.findings
    by_class: Counter[str] = Counter()
    for f in findings:
        rule = _rule(f.code)
        by_class[rule.rule_class.value if rule else "?"] += 1
    fixed = sum(f.fixed for f in findings)
    return {
        "files_scanned": sum(r.status != SKIPPED for r in files),
        "skipped": {"not_regular": sum(r.skip == NOT_REGULAR for r in files),
                    "too_large": sum(r.skip == TOO_LARGE for r in files)},
        "python_files": sum("python" in r.kinds and r.status != SKIPPED for r in files),
        "other_files": sum("python" not in r.kinds and r.status != SKIPPED for r in files),
        "skipped_by_prefilter": sum(r.status == PREFILTERED for r in files),
        "changed": sum(r.status == CHANGED or r.written for r in files),
        "written": sum(r.written for r in files),
        "unparsable": sum(r.status == UNPARSABLE for r in files),
        "errors": sum(r.status == ERROR for r in files),
        "findings": len(findings),
        "by_severity": {str(s): sum(f.severity == s for f in findings) for s in _SEVERITIES},
        "by_class": {c: by_class.get(c, 0) for c in _CLASSES},
        "fixes_applied": fixed,
        "needing_review": len(findings) - fixed,
        "unsafe_fixes_available": sum(f.fixable and not f.fixed for f in findings),
    }


def tag(f: Finding, command: str) -> str:
    """The marker after a finding's code: [fixed] (port) / [*] (check: port fixes it) / [unsafe-fix]."""
    if f.fixed:
        return "[fixed] " if command == "port" else "[*] "
    if f.fixable:
        return "[unsafe-fix] "
    return ""


def location(f: Finding) -> str:
    """`path:line:col`, or `path:cell N:line:col` for a finding in a notebook cell (as ruff prints it)."""
    cell = f.extra.get("cell") if f.extra else None
    return f"{f.path}:{'' if cell is None else f'cell {cell}:'}{f.line}:{f.col}"


def finding_lines(result: RunResult, command: str) -> list[str]:
    """One `path:line:col: CODE [tag] message` line per finding."""
    return [f"{location(f)}: {f.code} {tag(f, command)}{f.message}" for f in result.findings]


def skipped_lines(result: RunResult) -> list[str]:
    """One `note: PATH: skipped: WHY` line per file listed but not read."""
    return [f"note: {r.display}: skipped: {r.skip}" for r in result.files if r.status == SKIPPED]


def problem_lines(result: RunResult) -> list[str]:
    """Files the run could not handle (unparsable, unreadable, unwritable), one warning line each."""
    out = []
    for r in result.files:
        if r.status == UNPARSABLE:
            why = next((f.message for f in r.findings if f.code == "TPU900"), "could not be parsed")
            out.append(f"warning: {r.display}: {why}")
        elif r.status == ERROR:
            out.append(f"warning: {r.display}: {r.error}")
    return out


def summary_table(result: RunResult, command: str):  # -> rich.table.Table
    """The human summary as a rich Table."""
    from rich.table import Table

    s = summary(result)
    t = Table(title=f"tputool {command}", show_header=False, box=None, padding=(0, 1), title_justify="left")
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_column()
    t.add_row("files scanned", str(s["files_scanned"]), f"{s['python_files']} python, {s['other_files']} other")
    t.add_row("skipped by pre-filter", str(s["skipped_by_prefilter"]), "no CUDA-related text, not parsed")
    sk = s["skipped"]
    if sk["not_regular"] or sk["too_large"]:
        t.add_row("skipped, not read", str(sk["not_regular"] + sk["too_large"]),
                  f"{sk['not_regular']} not a regular file, {sk['too_large']} over max-file-size")
    if command == "port":
        note = f"written: {s['written']}" if s["written"] else "not written (use --write to apply)"
        t.add_row("changed", str(s["changed"]), note)
    else:
        t.add_row("would change", str(s["changed"]), "run `tputool port --write` to apply")
    t.add_row("unparsable", str(s["unparsable"]), "left untouched" if s["unparsable"] else "")
    if s["errors"]:
        t.add_row("errors", str(s["errors"]), "unreadable/unwritable files")
    sev = ", ".join(f"{k} {v}" for k, v in s["by_severity"].items())
    cls = ", ".join(f"{k} {v}" for k, v in s["by_class"].items())
    t.add_row("findings", str(s["findings"]), sev)
    t.add_row("  by class", "", cls)
    fixed_label = "fixes applied" if command == "port" else "auto-fixable"
    t.add_row(fixed_label, str(s["fixes_applied"]), "")
    extra = f"{s['unsafe_fixes_available']} fixable with --unsafe-fixes" if s["unsafe_fixes_available"] else ""
    t.add_row("needing review", str(s["needing_review"]), extra)
    return t


def statistics_lines(result: RunResult) -> list[str]:
    """`count  CODE  name  [n fixable]` per rule that fired, most frequent first."""
    counts = Counter(f.code for f in result.findings)
    fixable = Counter(f.code for f in result.findings if f.fixed or f.fixable)
    out = []
    for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        rule = _rule(code)
        name = rule.name if rule else ""
        fx = f"{' ' * max(2, 28 - len(name))}[{fixable[code]} fixable]" if fixable[code] else ""
        out.append(f"{n:5d}  {code}  {name}{fx}")
    return out


def _finding_json(f: Finding) -> dict[str, Any]:
    rule = _rule(f.code)
    return {
        "path": f.path, "line": f.line, "col": f.col, "code": f.code,
        "name": rule.name if rule else None, "message": f.message, "severity": str(f.severity),
        "class": rule.rule_class.value if rule else None, "fixed": f.fixed, "fixable": f.fixable,
        **({"extra": f.extra} if f.extra else {}),
    }


def to_json(result: RunResult, command: str) -> dict[str, Any]:
    """The machine-readable report: settings, summary, every file's status/diff and every finding."""
    cfg = result.config
    return {
        "tool": "tputool", "version": __version__, "command": command,
        "config": str(cfg.source) if cfg.source else None,
        "settings": {
            "select": sorted(cfg.select) if cfg.select is not None else None,
            "ignore": sorted(cfg.ignore), "unsafe_fixes": cfg.unsafe_fixes,
        },
        "summary": summary(result),
        "files": [
            {"path": r.display, "kinds": list(r.kinds), "status": r.status, "written": r.written,
             **({"error": r.error} if r.error else {}), **({"diff": r.diff} if r.diff else {}),
             "findings": [_finding_json(f) for f in r.findings]}
            for r in result.files
        ],
        "findings": [_finding_json(f) for f in result.findings],
        "statistics": dict(sorted(Counter(f.code for f in result.findings).items())),
    }


_SARIF_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def _sarif_uri(path: str) -> str:
    p = Path(path)
    return p.as_uri() if p.is_absolute() else p.as_posix()


def to_sarif(result: RunResult) -> dict[str, Any]:
    """A SARIF 2.1.0 log: tool.driver.rules from the rule table, one result per finding."""
    rules = list(all_rules().values())
    index = {r.code: i for i, r in enumerate(rules)}
    driver_rules = [
        {
            "id": r.code, "name": r.name,
            "shortDescription": {"text": r.message},
            "fullDescription": {"text": r.doc.splitlines()[0] if r.doc else r.message},
            "help": {"text": r.doc or r.message},
            "defaultConfiguration": {"level": _SARIF_LEVEL[r.severity]},
            "properties": {"class": r.rule_class.value, "fix": r.fix.value,
                           "patterns": list(r.patterns)},
        }
        for r in rules
    ]
    results = []
    for f in result.findings:
        res: dict[str, Any] = {
            "ruleId": f.code,
            "level": _SARIF_LEVEL[f.severity],
            "message": {"text": f.message},
            "locations": [{"physicalLocation": {
                "artifactLocation": {"uri": _sarif_uri(f.path)},
                "region": {"startLine": f.line, "startColumn": f.col},
            }}],
            "properties": {"fixable": f.fixed or f.fixable},
        }
        if f.code in index:
            res["ruleIndex"] = index[f.code]
        results.append(res)
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": "tputool", "version": __version__, "rules": driver_rules}},
            "results": results,
        }],
    }


def _gh_escape(s: str, prop: bool = False) -> str:
    s = s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        s = s.replace(":", "%3A").replace(",", "%2C")
    return s


_GH_LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def to_github(result: RunResult) -> list[str]:
    """GitHub Actions workflow-command annotations, one `::error file=..,line=..,col=..,title=..::msg` each."""
    return [
        f"::{_GH_LEVEL[f.severity]} file={_gh_escape(f.path, True)},line={f.line},col={f.col},"
        f"title={_gh_escape(f.code, True)}::{_gh_escape(f.message)}"
        for f in result.findings
    ]
