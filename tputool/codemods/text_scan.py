"""Apply the TPU9xx line-oriented patterns (`tputool.rules.text.TEXT_PATTERNS`) to one non-Python file."""

from __future__ import annotations

import re
from collections.abc import Iterable

from tputool.rules.model import Finding, Settings, is_suppressed, suppressed_codes
from tputool.rules.text import TEXT_PATTERNS, TEXT_RULES, TextPattern

# Full-line comments are skipped, except scheduler directives that are live options.
_DIRECTIVES = ("#SBATCH", "#PBS", "#BSUB", "#$")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _block(lines: list[str], i: int) -> Iterable[str]:
    """The lines indented deeper than line i (a YAML mapping or pretty-printed JSON object below it)."""
    base = _indent(lines[i])
    for line in lines[i + 1:]:
        if not line.strip():
            continue
        if _indent(line) <= base:
            return
        yield line


def patterns_for(kinds: frozenset[str], settings: Settings) -> list[TextPattern]:
    """The enabled patterns that apply to a file of `kinds`."""
    return [p for p in TEXT_PATTERNS if p.kinds & kinds and settings.enabled(p.code)]


def _message(p: TextPattern, m: re.Match[str] | None, count: int) -> str:
    rule = TEXT_RULES[p.code]
    if p.message is None:
        return rule.message
    fields = {"match": m.group(0).strip() if m else "", "count": count}
    if m:
        fields.update({k: v for k, v in m.groupdict().items() if v is not None})
    return p.message.format(**fields)


def scan_text(text: str, path: str, kinds: frozenset[str], settings: Settings) -> list[Finding]:
    """Findings of every enabled TPU9xx pattern in `text` (a file of `kinds`), minus suppressed lines."""
    pats = patterns_for(kinds, settings)
    if not pats:
        return []
    lines = text.splitlines()
    found: dict[tuple[int, str], Finding] = {}
    done: set[int] = set()  # indexes of `once` patterns that already fired
    for i, line in enumerate(lines):
        head = line.lstrip()
        if head.startswith("//") or (head.startswith("#") and not head.startswith(_DIRECTIVES)):
            continue
        sup = suppressed_codes(line, non_python=True) if "tputool" in line else None
        for k, p in enumerate(pats):
            if k in done or (i + 1, p.code) in found:
                continue
            m = p.regex.search(line)
            if m is None:
                continue
            if p.follow is not None:
                rest = [line[m.start():], *_block(lines, i)]
                if not any(p.follow.search(t) for t in rest):
                    continue
            if p.once:
                done.add(k)
            if is_suppressed(p.code, sup):
                continue
            count = len(p.regex.findall(text)) if p.once else 1
            rule = TEXT_RULES[p.code]
            col = (m.start("pkg") if "pkg" in p.regex.groupindex else m.start()) + 1
            found[(i + 1, p.code)] = Finding(
                path=path, line=i + 1, col=col, code=p.code, message=_message(p, m, count),
                severity=rule.severity, extra={"match": m.group(0).strip()},
            )
    for k, p in enumerate(pats):
        if p.always and k not in done:
            first = lines[0] if lines else ""
            if not is_suppressed(p.code, suppressed_codes(first, non_python=True)):
                rule = TEXT_RULES[p.code]
                found[(1, p.code)] = Finding(path=path, line=1, col=1, code=p.code, message=_message(p, None, 0),
                                             severity=rule.severity)
    return sorted(found.values(), key=lambda f: (f.line, f.col, f.code))
