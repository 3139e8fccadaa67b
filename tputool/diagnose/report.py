"""Render a diagnose Report: a rich text report grouped by severity, or JSON for tools and CI.

JSON schema "tputool.diagnose/1" (fields are only ever added, never renamed):
  schema: "tputool.diagnose/1"; script: path; status: ok | error | exited | step_limit | timeout | interrupted |
  crashed | static; exit_code: the script's exit status (128+N when signal N killed it; see
  tputool/diagnose/exits.py for diagnose's own); signal: null or its name ("SIGSEGV");
  stopped_at: null or {file, line}, the last user line seen at --timeout or an interrupt; steps: optimizer steps run; wall_s / run_s: seconds (null for --static);
  step_s: median seconds per step (per call for a loop without an optimizer) over the second half of the run
  (null with fewer than 2); loop: "steps" | "calls" (model calls, no optimizer step: inference, generate) | null;
  calls: top-level model calls counted when no optimizer step ran;
  compiled_before_first_step: XLA compiles before the first step (first model call of a loop without an
  optimizer) ended, a persistent-cache hit not counted; launches_per_step: device programs launched per step
  (per call), median over the second half of the run (both null for a run that did not use the tpu device,
  the latter with fewer than 2 steps);
  devices: device types tensors lived on; note: null or a remark (e.g. static analysis skipped);
  verdict: the one-line summary; summary: {error, warning, info}: counts;
  findings: [{severity: error|warning|info, code, name, file, line (1-based; 0 for a finding about the whole
  run), message, fix, count, per_step (null when no steps ran), source: runtime|static,
  cost_ms_per_step: the time it costs per step in ms (null when unknown: no time cost, or static),
  cost_basis: "measured" (timed in the run: compiled-step comparison, steady-state compiles) | "estimated"
  (events per step x a typical price, tputool.diagnose.cost) | null,
  extra: {...rule-specific...}}], most severe first, then most costly per step; static findings of a run that no runtime finding
  confirmed have source "static" and are not counted in the verdict (they are "static, not seen at runtime");
  error: null or {type, message, traceback: [{file, line, function, text}] (the user's frames only)}.
"""

from __future__ import annotations

import json
import os

from tputool.diagnose.model import Finding, Report
from tputool.rules.model import Severity
from tputool.rules.runtime import BY_CODE

SCHEMA = "tputool.diagnose/1"
_HEADINGS = {Severity.ERROR: "ERRORS", Severity.WARNING: "WARNINGS", Severity.INFO: "NOTES"}
_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def display_path(path: str) -> str:
    """`path` relative to the working directory when it lies under it, else unchanged."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most severe first; then the most costly per step (`tputool.diagnose.cost`); then the most frequent; then
    by file and line."""
    from tputool.diagnose.cost import rank_key

    return sorted(findings, key=lambda f: (-int(f.severity), rank_key(f), -(f.per_step or 0), -f.count, f.path,
                                           f.line, f.code))


def _where(f: Finding) -> str:
    """`file:line`, or only the file for a finding about the whole run (line 0)."""
    return f"{display_path(f.path)}:{f.line}" if f.line else display_path(f.path)


def _unit(report: Report) -> str:
    """What the run's figures are per: a model call for a loop without an optimizer, else a step."""
    return "call" if report.loop == "calls" else "step"


def _label(f: Finding, unit: str) -> str:
    from tputool.diagnose.cost import figure

    title = f.extra.get("title") if f.source == "static" else None
    title = title or (BY_CODE[f.code].message if f.code in BY_CODE else f.name)
    cost = figure(f, unit)
    return f"{title}: {cost} ({_where(f)})" if cost else f"{title} ({_where(f)})"


def _ending(report: Report) -> str | None:
    """How the run ended, when that is the headline: failed, exited, killed, timed out, interrupted."""
    err = report.error or {}
    first = (err.get("message") or "").strip().split("\n", 1)[0]
    if report.status == "error":
        return f"The script failed: {err.get('type', 'error')}: {first}".rstrip(": ")
    if report.status in ("exited", "crashed"):
        return first[:1].upper() + first[1:] if first else f"The script ended with status {report.exit_code}"
    at = f" at {display_path(report.stopped_at[0])}:{report.stopped_at[1]}" if report.stopped_at else ""
    if report.status == "timeout":
        return f"Stopped at --timeout{at}"
    if report.status == "interrupted":
        return f"Interrupted{at}"
    return None


def verdict(report: Report) -> str:
    """The one-line summary at the top of the report."""
    problems = sort_findings(report.problems())
    notes = sum(1 for f in report.findings if f.severity == Severity.INFO and f.source == "runtime")
    unseen = len(report.static_unseen())
    tail = f" ({notes} note{'s' * (notes != 1)})" if notes else ""
    if unseen:
        tail += f" ({unseen} static finding{'s' * (unseen != 1)} not seen at runtime)"
    n = len(problems)
    top = "; ".join(_label(f, _unit(report)) for f in problems[:3]) + ("; ..." if len(problems) > 3 else "")
    head = _ending(report)
    if head is not None:
        if problems:
            head += f"; also {n} problem{'s' * (n != 1)} for TPU: {top}"
        return head + tail
    if report.static_only:
        if not problems:
            return f"No problems found for TPU in this script (static analysis only){tail}."
        return f"{n} problem{'s' * (n != 1)} for TPU in this script (static analysis only): {top}{tail}"
    if not problems:
        return f"No problems found that slow this script on TPU{tail}."
    return f"{n} problem{'s' * (n != 1)} slow{'s' * (n == 1)} this script on TPU: {top}{tail}"


def _run_line(report: Report) -> str:
    if report.static_only:
        return "static analysis only (the script was not run)"
    how = {"ok": "finished", "step_limit": "stopped at --max-steps", "timeout": "stopped at --timeout",
           "error": "failed", "exited": f"exited with status {report.exit_code}", "interrupted": "interrupted",
           "crashed": f"killed by {report.signal}" if report.signal else "crashed"}.get(report.status, report.status)
    accel = [d for d in report.devices if d != "cpu"] or report.devices
    devices = f" on {', '.join(accel)}" if accel else ""
    secs = f" in {report.wall_s:.1f} s" if report.wall_s is not None else ""
    unit = _unit(report)
    step = f" ({report.step_s * 1000:.1f} ms/{unit} in steady state)" if report.step_s is not None else ""
    if report.loop == "calls":
        ran = f"ran {report.calls} model call{'s' * (report.calls != 1)} (no optimizer step)"
    else:
        ran = f"ran {report.steps} optimizer step{'s' * (report.steps != 1)}"
    return f"{ran}{devices}{secs}{step}; {how}"


def _programs_line(report: Report) -> str | None:
    """The device-program figures of a tpu run: XLA compiles before the first step, launches per steady step."""
    unit = _unit(report)
    parts = []
    if report.first_compiles is not None:
        parts.append(f"{report.first_compiles} XLA program{'s' * (report.first_compiles != 1)} compiled before "
                     f"the first {unit} ended")
    if report.launches is not None:
        parts.append(f"{report.launches} device program launch{'es' * (report.launches != 1)} per {unit} in "
                     "steady state")
    return "device programs: " + ", ".join(parts) if parts else None


def to_json(report: Report) -> str:
    """The report as JSON (schema tputool.diagnose/1)."""
    doc = {
        "schema": SCHEMA, "script": display_path(report.script), "status": report.status,
        "exit_code": report.exit_code, "signal": report.signal,
        "stopped_at": report.stopped_at and {"file": display_path(report.stopped_at[0]), "line": report.stopped_at[1]},
        "steps": report.steps, "wall_s": report.wall_s, "run_s": report.run_s,
        "step_s": report.step_s, "loop": report.loop, "calls": report.calls,
        "compiled_before_first_step": report.first_compiles, "launches_per_step": report.launches,
        "devices": report.devices, "note": report.note, "verdict": verdict(report), "summary": report.counts(),
        "findings": [{"severity": str(f.severity), "code": f.code, "name": f.name, "file": display_path(f.path),
                      "line": f.line, "message": f.message, "fix": f.fix, "count": f.count, "per_step": f.per_step,
                      "source": f.source, "cost_ms_per_step": f.extra.get("cost_ms"),
                      "cost_basis": f.extra.get("cost_basis"), "extra": f.extra} for f in sort_findings(report.findings)],
        "error": report.error and {**report.error, "traceback": [
            {**fr, "file": display_path(fr["file"])} for fr in report.error.get("traceback", [])]},
    }
    return json.dumps(doc, indent=2)


def render_text(report: Report, console: object) -> None:
    """Print the report with rich: verdict, run facts, findings by severity, the trimmed traceback."""
    from rich.markup import escape

    from tputool.diagnose.cost import figure

    c = console
    c.print(f"[bold]{escape(verdict(report))}[/bold]")
    c.print(f"[dim]{escape(display_path(report.script))}: {escape(_run_line(report))}[/dim]")
    programs = _programs_line(report)
    if programs:
        c.print(f"[dim]{escape(programs)}[/dim]")
    if report.note:
        c.print(f"[dim]note: {escape(report.note)}[/dim]")
    unseen = report.static_unseen()
    findings = sort_findings([f for f in report.findings if not any(f is u for u in unseen)])
    groups = [(_HEADINGS[sev], _STYLE[sev], [f for f in findings if f.severity == sev])
              for sev in (Severity.ERROR, Severity.WARNING, Severity.INFO)]
    groups.append(("STATIC, NOT SEEN AT RUNTIME", "dim", sort_findings(unseen)))
    unit = _unit(report)
    for heading, style, group in groups:
        if not group:
            continue
        c.print(f"\n[{style}]{heading} ({len(group)})[/{style}]")
        for f in group:
            rate = f" [dim]{f.per_step:g}/{unit}[/dim]" if f.per_step is not None and f.count > 1 \
                and not f.extra.get("periodic") else ""  # a periodic finding's message gives its amortised rate
            cost = figure(f, unit) if f.code != "TPU813" else None  # TPU813's message holds its figure
            rate += f" [dim]({escape(cost)})[/dim]" if cost else ""
            c.print(f"  [{_STYLE[f.severity]}]{f.code}[/{_STYLE[f.severity]}] {escape(_where(f))}  "
                    f"{escape(f.message)}{rate}" + (" [dim](static)[/dim]" if f.source == "static" else ""))
            c.print(f"         [green]fix:[/green] {escape(f.fix)}")
    if report.error and report.error.get("traceback"):
        c.print("\n[bold red]Traceback (your frames only):[/bold red]")
        for fr in report.error["traceback"]:
            c.print(f"  {escape(display_path(fr['file']))}:{fr['line']} in {escape(fr['function'])}")
            if fr.get("text"):
                c.print(f"    {escape(fr['text'])}")
        c.print(f"[red]{escape(report.error['type'])}: {escape(report.error['message'])}[/red]")
