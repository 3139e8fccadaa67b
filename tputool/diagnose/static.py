"""The static side of diagnose: the findings `tputool check` reports for the script, as diagnose findings."""

from __future__ import annotations

import os

from tputool.diagnose.model import Finding
from tputool.rules.model import FixSafety
from tputool.rules.runtime import BY_CODE, FIX


def _fix_text(code: str, rule_doc: str, fixable: bool, path: str, unsafe: bool = False) -> str:
    """The one-line fix: `tputool port` when check can rewrite it (with --unsafe-fixes when the rule's only
    fix is unsafe), else the rule's own advice."""
    if fixable:
        if unsafe:
            return f"`tputool port --write --unsafe-fixes {path}` rewrites this (review the change: the fix is unsafe)"
        return f"`tputool port --write {path}` rewrites this"
    if code in FIX:
        return FIX[code]
    before_fix = rule_doc.split("Fix:", 1)[0].strip()
    sentences = [x.strip() for x in before_fix.replace("\n", " ").split(". ") if x.strip()]
    return sentences[-1].rstrip(".") if sentences else "see `tputool rules` for this code"


def static_findings(script: str) -> list[Finding]:
    """Run check's rules (with the project's [tool.tputool] config) over `script`; no execution."""
    from tputool.codemods import engine
    from tputool.codemods.config import load_config
    from tputool.rules.catalogue import all_rules

    rules = all_rules()
    cfg = load_config([script], None, rules.keys())
    result = engine.run([script], cfg, want_diff=False, jobs=1)
    out = []
    for r in result.files:
        for f in r.findings:
            rule = rules.get(f.code)
            out.append(Finding(
                path=os.path.abspath(r.path), line=f.line, col=f.col, code=f.code, message=f.message,
                severity=f.severity, fixable=f.fixable, name=rule.name if rule else f.code,
                fix=_fix_text(f.code, rule.doc if rule else "", f.fixable, r.display,
                              rule is not None and rule.fix is FixSafety.UNSAFE),
                source="static", extra={"col": f.col, "fixable": f.fixable,
                                        "title": rule.message if rule else f.message,
                                        "patterns": list(rule.patterns) if rule else []}))
    return out


def merge(runtime: list[Finding], static: list[Finding]) -> list[Finding]:
    """Runtime findings plus the static ones that no runtime finding at the same line already covers.

    Two findings cover the same thing when they share a row of cuda-patterns.md (e.g. row 76, host syncs;
    row 62, a custom op that the run saw fall back to the CPU).
    """
    covered: set[tuple[str, int, int]] = set()
    for f in runtime:
        for p in (*(BY_CODE[f.code].patterns if f.code in BY_CODE else ()), *f.extra.get("patterns", ())):
            covered.add((f.path, f.line, p))
    return runtime + [s for s in static
                      if not any((s.path, s.line, p) in covered for p in s.extra.get("patterns", []))]
