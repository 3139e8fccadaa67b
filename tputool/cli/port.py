"""The `tputool port`, `tputool check` and `tputool rules` commands (registered on the app by tputool/cli/__init__.py).

Heavy imports (libcst, the rule modules) happen inside the commands so `tputool --help` stays fast.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from tputool.errors import UserError

_PATHS = typer.Argument(None, help="Files or directories to scan (default: the current directory).")


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn UserError into `error: ...` on stderr and exit status 2 (also under CliRunner)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(e.exit_code) from None

    return wrapper


def _codes(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out.extend(c for c in v.split(",") if c.strip())
    return out


def _prepare(paths: list[str] | None, config: str | None, select: list[str] | None, ignore: list[str] | None):
    from tputool.codemods.config import check_codes, load_config
    from tputool.rules.catalogue import all_rules

    paths = paths or ["."]
    for p in paths:
        if not Path(p).exists():
            raise UserError(f"path does not exist: {p}")
    known = all_rules().keys()
    cfg = load_config(paths, config, known)
    sel = check_codes(_codes(select), known, "--select") if select else None
    ign = check_codes(_codes(ignore), known, "--ignore")
    return paths, cfg, sel, ign


class _Progress:
    """A rich progress bar on stderr, shown only on a terminal and for runs with many files."""

    MIN_FILES = 200

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.bar = None
        self.task = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total < self.MIN_FILES:
            return
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            # auto_refresh=False: no background thread, so forking the worker pool stays safe.
            self.bar = Progress("porting", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=Console(stderr=True), auto_refresh=False, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("files", total=total)
        self.bar.update(self.task, completed=done)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _write(text: str) -> None:
    """Write to stdout even when its encoding cannot represent the text (e.g. PYTHONIOENCODING=ascii)."""
    try:
        sys.stdout.write(text)
    except UnicodeEncodeError:
        enc = getattr(sys.stdout, "encoding", None) or "ascii"
        sys.stdout.write(text.encode(enc, "backslashreplace").decode(enc))


def _print_diff(diff: str) -> None:
    if not sys.stdout.isatty():
        _write(diff)
        return
    for line in diff.splitlines(keepends=True):
        color = None
        if line.startswith(("+++", "---")):
            color = "bright_white"
        elif line.startswith("+"):
            color = "green"
        elif line.startswith("-"):
            color = "red"
        elif line.startswith("@@"):
            color = "cyan"
        _write(typer.style(line, fg=color) if color else line)


@_user_errors
def port(
    paths: list[str] | None = _PATHS,
    write: bool = typer.Option(False, "--write", "-w", help="Apply the changes to the files (atomically)."),
    unsafe_fixes: bool = typer.Option(False, "--unsafe-fixes", help="Also apply fixes marked unsafe."),
    select: list[str] | None = typer.Option(None, "--select", help="Only these rule codes/prefixes (comma list)."),
    ignore: list[str] | None = typer.Option(None, "--ignore", help="Skip these rule codes/prefixes (comma list)."),
    exclude: list[str] | None = typer.Option(None, "--exclude", help="Glob of paths to skip (repeatable)."),
    config: str | None = typer.Option(None, "--config", help="Config file (default: nearest pyproject.toml)."),
    report: Path | None = typer.Option(None, "--report", help="Write a JSON report of every change and finding."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the diff (no summary, no findings)."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Worker processes (0: all cores, 1: no pool)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on long runs (tty only)."),
) -> None:
    """Rewrite CUDA code for TPU: show a diff (or --write it), a summary and the findings.

    Exit status: 0 when every file was processed; 1 when some file could not be parsed, decoded or written (it is reported and left untouched, the others are still ported); 2 for bad usage.
    """
    from rich.console import Console

    from tputool.codemods import engine, writer
    from tputool.codemods import report as rep

    paths, cfg, sel, ign = _prepare(paths, config, select, ignore)
    bar = _Progress(progress)
    try:
        result = engine.run(paths, cfg, unsafe_fixes=unsafe_fixes, select=sel, ignore=ign, exclude=exclude or (),
                            want_diff=True, jobs=jobs or None, progress=bar)
    finally:
        bar.close()
    if write:
        writer.apply(result)
    else:
        for r in result.files:
            if r.diff:
                _print_diff(r.diff)
    if report is not None:
        try:
            report.write_text(json.dumps(rep.to_json(result, "port"), indent=2) + "\n", encoding="utf-8")
        except OSError as e:
            raise UserError(f"cannot write report {report}: {e.strerror}") from None
    if not quiet:
        out = Console(highlight=False, soft_wrap=True)
        if not write and any(r.diff for r in result.files):
            out.print()
        out.print(rep.summary_table(result, "port"))
        lines = rep.finding_lines(result, "port")
        if lines:
            out.print()
            _write("".join(line + "\n" for line in lines))
    for line in rep.problem_lines(result):
        typer.echo(line, err=True)
    if any(r.status in (engine.UNPARSABLE, engine.ERROR) for r in result.files):
        raise typer.Exit(1)


_FORMATS = ("text", "json", "sarif", "github")


@_user_errors
def check(
    paths: list[str] | None = _PATHS,
    fail_on: str | None = typer.Option(None, "--fail-on",
                                       help="Fail (exit 1) on findings at or above: error|warning|info "
                                            "(default: config fail-on, else warning)."),
    fmt: str = typer.Option("text", "--format", help="Output: text | json | sarif | github."),
    changed_since: str | None = typer.Option(None, "--changed-since",
                                             help="Only files changed since this git ref (plus untracked files)."),
    statistics: bool = typer.Option(False, "--statistics", help="Counts per rule instead of each finding."),
    unsafe_fixes: bool = typer.Option(False, "--unsafe-fixes", help="Count unsafe fixes as fixable."),
    select: list[str] | None = typer.Option(None, "--select", help="Only these rule codes/prefixes (comma list)."),
    ignore: list[str] | None = typer.Option(None, "--ignore", help="Skip these rule codes/prefixes (comma list)."),
    exclude: list[str] | None = typer.Option(None, "--exclude", help="Glob of paths to skip (repeatable)."),
    config: str | None = typer.Option(None, "--config", help="Config file (default: nearest pyproject.toml)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report to this file, not stdout."),
    jobs: int = typer.Option(0, "--jobs", "-j", help="Worker processes (0: all cores, 1: no pool)."),
) -> None:
    """Report what still needs porting, never writing; exit 1 when a finding at or above --fail-on remains."""
    from tputool.codemods import engine
    from tputool.codemods import report as rep
    from tputool.codemods.config import parse_severity
    from tputool.codemods.discover import changed_files

    if fmt not in _FORMATS:
        raise UserError(f"--format must be one of {', '.join(_FORMATS)}, not {fmt!r}")
    paths, cfg, sel, ign = _prepare(paths, config, select, ignore)
    threshold = parse_severity(fail_on, "--fail-on") if fail_on else (cfg.fail_on or parse_severity("warning", ""))
    only = changed_files(changed_since, Path(paths[0])) if changed_since else None
    result = engine.run(paths, cfg, unsafe_fixes=unsafe_fixes, select=sel, ignore=ign, exclude=exclude or (),
                        only=only, want_diff=False, jobs=jobs or None)
    failing = [f for f in result.findings if f.severity >= threshold]
    if fmt == "json":
        doc = rep.to_json(result, "check")
        doc["fail_on"] = str(threshold)
        doc["failed"] = bool(failing)
        text = json.dumps(doc, indent=2) + "\n"
    elif fmt == "sarif":
        text = json.dumps(rep.to_sarif(result), indent=2) + "\n"
    elif fmt == "github":
        text = "".join(line + "\n" for line in rep.to_github(result))
    else:
        lines = rep.statistics_lines(result) if statistics else rep.finding_lines(result, "check")
        s = rep.summary(result)
        sev = ", ".join(f"{v} {k}" for k, v in s["by_severity"].items())
        verdict = f"FAILED: {len(failing)} at or above {threshold}" if failing else f"passed (fail-on {threshold})"
        tail = (f"{s['findings']} finding(s) in {s['files_scanned']} file(s) ({sev}); "
                f"{s['fixes_applied']} fixable by `tputool port`; {verdict}")
        legend = [f"{t} {what}" for t, what in (("[*]", "fixed by `tputool port`"),
                                                 ("[unsafe-fix]", "fixed by `tputool port --unsafe-fixes`"))
                  if any(f" {t} " in line for line in lines)]
        text = "".join(line + "\n" for line in lines) + ("\n" if lines else "")
        text += ("; ".join(legend) + "\n" if legend else "") + tail + "\n"
    if output is not None:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as e:
            raise UserError(f"cannot write {output}: {e.strerror}") from None
    else:
        _write(text)
    if fmt == "text":
        for line in rep.problem_lines(result):
            typer.echo(line, err=True)
    if failing:
        raise typer.Exit(1)


@_user_errors
def rules(
    code: str | None = typer.Argument(None, help="A rule code (e.g. TPU101) to print its documentation."),
) -> None:
    """List every rule (code, name, class, fix safety, severity), or print one rule's documentation."""
    from rich.console import Console
    from rich.table import Table

    from tputool.rules.catalogue import get_rule, listed_rules

    out = Console(highlight=False, soft_wrap=True)
    if code is not None:
        r = get_rule(code)
        typer.echo(f"{r.code} {r.name}")
        typer.echo(f"class: {r.rule_class.value}   fix: {r.fix.value}   severity: {r.severity}")
        if r.patterns:
            typer.echo(f"cuda-patterns rows: {', '.join(map(str, r.patterns))}")
        typer.echo("")
        typer.echo(r.message)
        typer.echo("")
        typer.echo(r.doc)
        return
    t = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for col in ("code", "name", "class", "fix", "severity", "reported by"):
        t.add_column(col, no_wrap=True)
    for r, command in listed_rules().values():
        t.add_row(r.code, r.name, r.rule_class.value, r.fix.value, str(r.severity), command)
    out.print(t)


def register(app: typer.Typer) -> None:
    """Add port, check and rules to the tputool app."""
    app.command("port")(port)
    app.command("check")(check)
    app.command("rules")(rules)
