"""The `tputool port`, `tputool check` and `tputool rules` commands (registered on the app by tputool/cli/__init__.py).

Heavy imports (libcst, the rule modules) happen inside the commands so `tputool --help` stays fast.
"""

from __future__ import annotations

import enum
import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from tputool.cli.choices import FailOn, TextOrJson
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


def _prepare(paths: list[str] | None, config: str | None, select: list[str] | None, ignore: list[str] | None,
             max_file_size: str | None = None):
    from tputool.codemods.config import check_codes, load_config, parse_size
    from tputool.rules.catalogue import all_rules

    paths = paths or ["."]
    if "-" in paths and len(paths) > 1:
        raise UserError("`-` (standard input) cannot be combined with other paths")
    for p in paths:
        if p != "-" and not Path(p).exists() and not Path(p).is_symlink():
            raise UserError(f"path does not exist: {p}")
    known = all_rules().keys()
    cfg = load_config(["."] if paths == ["-"] else paths, config, known)
    if max_file_size is not None:
        cfg.max_file_size = parse_size(max_file_size, "--max-file-size")
    sel = check_codes(_codes(select), known, "--select") if select else None
    ign = check_codes(_codes(ignore), known, "--ignore")
    return paths, cfg, sel, ign


def _check_output(path: Path | None, flag: str) -> None:
    """Fail before anything is written when `path` cannot be created or replaced."""
    if path is None:
        return
    parent = path.absolute().parent
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a directory")
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"{flag} {path}: not writable")


def _report_bytes(result) -> bytes:
    """port's JSON report of `result`, as the bytes written to --report."""
    from tputool.codemods import report as rep

    return (json.dumps(rep.to_json(result, "port"), indent=2) + "\n").encode("utf-8")


def _stage(report: Path, data: bytes) -> str:
    """Write `data` to a temporary file beside `report`; a UserError (nothing else written) when that fails."""
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{report.name}.", suffix=".tputool-tmp", dir=report.absolute().parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        os.unlink(tmp)
        raise UserError(f"cannot write report {report}: {e.strerror}; no file written") from None
    return tmp


def _commit(staged: str, report: Path, data: bytes, result) -> None:
    """Replace the staged report with the final `data` and move it over `report`; on failure say what was written."""
    try:
        with open(staged, "wb") as f:
            f.write(data)
        os.replace(staged, report)
    except OSError as e:
        if os.path.exists(staged):
            os.unlink(staged)
        written = [r.display for r in result.files if r.written]
        listing = "".join(f"\n  {d}" for d in written)
        raise UserError(f"cannot write report {report}: {e.strerror}; "
                        f"{len(written)} file(s) were written:{listing}" if written
                        else f"cannot write report {report}: {e.strerror}; no file written") from None


class _Progress:
    """Progress on stderr: a rich bar on a terminal for runs with many files; with --verbose, plain lines too."""

    MIN_FILES = 200

    def __init__(self, enabled: bool, verbose: bool = False, label: str = "porting") -> None:
        self.tty = enabled and sys.stderr.isatty()
        self.verbose = verbose
        self.label = label
        self.bar = None
        self.task = None
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.tty:
            if self.verbose and total and (done == total or time.monotonic() - self.last >= 1.0):
                self.last = time.monotonic()
                typer.echo(f"{self.label}: {done}/{total} files", err=True)
            return
        if total < self.MIN_FILES and not self.verbose:
            return
        if self.bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            # auto_refresh=False: no background thread, so forking the worker pool stays safe.
            self.bar = Progress(self.label, BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                console=Console(stderr=True), auto_refresh=False, transient=True)
            self.bar.start()
            self.task = self.bar.add_task("files", total=total)
        self.bar.update(self.task, completed=done)
        self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def _run(paths: list[str], cfg, *, stdin_filename: str | None, want_diff: bool, bar: _Progress, **kw):
    """(engine.run over `paths`, None), or (the run over standard input, its bytes) when `paths` is ["-"]."""
    from tputool.codemods import engine

    if paths == ["-"]:
        data = sys.stdin.buffer.read()
        opts = {k: v for k, v in kw.items() if k in ("unsafe_fixes", "select", "ignore")}
        return engine.run_source(data, stdin_filename or "-", cfg, want_diff=want_diff, **opts), data
    try:
        return engine.run(paths, cfg, want_diff=want_diff, progress=bar, **kw), None
    finally:
        bar.close()


def _nothing_found(result, paths: list[str]) -> bool:
    """Warn (like ruff, exit 0) when a run found no file to scan; True when it did."""
    if result.files:
        return False
    typer.echo(f"warning: no Python or config files found under {', '.join(paths)}", err=True)
    return True


def _interrupted(result, writes: bool = True) -> None:
    """Ctrl-C: say so, list what was already written (when the command writes), exit 130 (no traceback)."""
    written = [r.display for r in (result.files if result is not None else []) if r.written]
    done = f"; {len(written)} file(s) already written:" if written else "; no file written"
    typer.echo("interrupted" + (done if writes else ""), err=True)
    for d in written:
        typer.echo(f"  {d}", err=True)
    raise typer.Exit(130)


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


class CheckFormat(enum.StrEnum):
    """check --format."""

    text = "text"
    json = "json"
    sarif = "sarif"
    github = "github"


RulesFormat = TextOrJson  # rules --format


_MAX_SIZE_HELP = "Skip files bigger than this (bytes, or 500K, 2MB; default 1MB) with a TPU940 finding."
_STDIN_HELP = "The name to give standard input (`-`): its kind, config globs and the paths shown."


@_user_errors
def port(
    paths: list[str] | None = _PATHS,
    write: bool = typer.Option(False, "--write", "-w", help="Apply the changes to the files (atomically)."),
    diff: bool = typer.Option(False, "--diff", help="Only print the diff, write nothing; exit 1 if a file would "
                                                    "change."),
    unsafe_fixes: bool = typer.Option(False, "--unsafe-fixes", help="Also apply fixes marked unsafe."),
    select: list[str] | None = typer.Option(None, "--select", help="Only these rule codes/prefixes (comma list)."),
    ignore: list[str] | None = typer.Option(None, "--ignore", help="Skip these rule codes/prefixes (comma list)."),
    exclude: list[str] | None = typer.Option(None, "--exclude", help="Glob of paths to skip (repeatable)."),
    config: str | None = typer.Option(None, "--config", help="Config file (default: nearest pyproject.toml)."),
    report: Path | None = typer.Option(None, "--report", help="Write a JSON report of every change and finding."),
    max_file_size: str | None = typer.Option(None, "--max-file-size", help=_MAX_SIZE_HELP),
    stdin_filename: str | None = typer.Option(None, "--stdin-filename", help=_STDIN_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the diff (no summary, no findings)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Progress even off a terminal; list skipped files."),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even when a file could not be ported or "
                                                              "--diff found changes."),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="Worker processes (0: all cores, 1: no pool)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on long runs (tty only)."),
) -> None:
    """Rewrite CUDA code for TPU: show a diff (or --write it), the findings and a summary.

    `-` reads standard input and prints the ported source (with --diff: the diff) on stdout, findings on
    stderr. Exit status: 0 when every file was processed; 1 when some file could not be parsed, decoded or written (it is reported and left untouched, the others are still ported), or --diff found changes; 2 for bad usage; 130 when interrupted.
    """
    from rich.console import Console

    from tputool.codemods import engine, writer
    from tputool.codemods import report as rep

    if write and diff:
        raise UserError("--write and --diff cannot be used together")
    paths, cfg, sel, ign = _prepare(paths, config, select, ignore, max_file_size)
    _check_output(report, "--report")
    if write and report is not None and report.exists() and not report.is_file():
        raise UserError(f"--report {report}: with --write the report must be a regular file "
                        "(it is written beside its target first, so a failure stops the run before any file changes)")
    result = None
    staged = None
    try:
        result, data = _run(paths, cfg, stdin_filename=stdin_filename, want_diff=True,
                            bar=_Progress(progress, verbose), unsafe_fixes=unsafe_fixes, select=sel, ignore=ign,
                            exclude=exclude or (), jobs=jobs or None)
        if data is not None:
            return _port_stdin(result, data, diff, quiet, exit_zero)
        if write and report is not None:
            staged = _stage(report, _report_bytes(result))  # fails here, before any file is touched
        if write:
            writer.apply(result)
    except KeyboardInterrupt:
        if staged is not None:
            os.unlink(staged)
        _interrupted(result)
    if not write:
        for r in result.files:
            if r.diff:
                _print_diff(r.diff)
    if report is not None and staged is None:
        try:
            report.write_bytes(_report_bytes(result))
        except OSError as e:
            raise UserError(f"cannot write report {report}: {e.strerror}") from None
    elif staged is not None:
        _commit(staged, report, _report_bytes(result), result)
    if _nothing_found(result, paths):
        return
    if not (quiet or diff):
        out = Console(highlight=False, soft_wrap=True)
        lines = rep.finding_lines(result, "port")
        if not write and any(r.diff for r in result.files) and lines:
            _write("\n")
        _write("".join(line + "\n" for line in lines))
        out.print()
        out.print(rep.summary_table(result, "port"))  # last, so it does not scroll away
    _notes(result, quiet, verbose)
    failed = any(r.status in (engine.UNPARSABLE, engine.ERROR) for r in result.files)
    if (failed or (diff and any(r.diff for r in result.files))) and not exit_zero:
        raise typer.Exit(1)


def _notes(result, quiet: bool, verbose: bool) -> None:
    """Problem files (always) and files skipped unread (not regular: always; too large: with -v) on stderr."""
    from tputool.codemods import report as rep
    from tputool.codemods.discover import NOT_REGULAR

    for line in rep.problem_lines(result):
        typer.echo(line, err=True)
    if quiet:
        return
    for r, line in zip([r for r in result.files if r.skip], rep.skipped_lines(result), strict=True):
        if verbose or r.skip == NOT_REGULAR:
            typer.echo(line, err=True)


def _port_stdin(result, data: bytes, diff: bool, quiet: bool, exit_zero: bool) -> None:
    """`port -`: the ported source (or its diff) on stdout, findings on stderr."""
    from tputool.codemods import engine
    from tputool.codemods import report as rep

    r = result.files[0]
    if diff:
        _write(r.diff)
    elif r.new_text is not None:
        _write(r.new_text)
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(data)  # unchanged (or unparsable): the input, byte for byte
    if not quiet:
        for line in rep.finding_lines(result, "port"):
            typer.echo(line, err=True)
    for line in rep.problem_lines(result):
        typer.echo(line, err=True)
    if ((diff and r.diff) or r.status in (engine.UNPARSABLE, engine.ERROR)) and not exit_zero:
        raise typer.Exit(1)


@_user_errors
def check(
    paths: list[str] | None = _PATHS,
    fail_on: FailOn | None = typer.Option(None, "--fail-on", case_sensitive=False,
                                          help="Fail (exit 1) on findings at or above this severity "
                                               "(default: config fail-on, else warning)."),
    fmt: CheckFormat = typer.Option(CheckFormat.text, "--format", case_sensitive=False, help="Output format."),
    changed_since: str | None = typer.Option(None, "--changed-since",
                                             help="Only files changed since this git ref (plus untracked files)."),
    statistics: bool = typer.Option(False, "--statistics", help="Counts per rule instead of each finding."),
    unsafe_fixes: bool = typer.Option(False, "--unsafe-fixes", help="Count unsafe fixes as fixable."),
    select: list[str] | None = typer.Option(None, "--select", help="Only these rule codes/prefixes (comma list)."),
    ignore: list[str] | None = typer.Option(None, "--ignore", help="Skip these rule codes/prefixes (comma list)."),
    exclude: list[str] | None = typer.Option(None, "--exclude", help="Glob of paths to skip (repeatable)."),
    config: str | None = typer.Option(None, "--config", help="Config file (default: nearest pyproject.toml)."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the report to this file, not stdout."),
    max_file_size: str | None = typer.Option(None, "--max-file-size", help=_MAX_SIZE_HELP),
    stdin_filename: str | None = typer.Option(None, "--stdin-filename", help=_STDIN_HELP),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print only the findings (no summary line)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Progress even off a terminal; list skipped files."),
    exit_zero: bool = typer.Option(False, "--exit-zero", help="Exit 0 even when findings at or above --fail-on "
                                                              "remain."),
    jobs: int = typer.Option(0, "--jobs", "-j", min=0, help="Worker processes (0: all cores, 1: no pool)."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bar on long runs (tty only)."),
) -> None:
    """Report what still needs porting, never writing; exit 1 when a finding at or above --fail-on remains."""
    from tputool.codemods import report as rep
    from tputool.codemods.config import parse_severity
    from tputool.codemods.discover import changed_files

    paths, cfg, sel, ign = _prepare(paths, config, select, ignore, max_file_size)
    _check_output(output, "--output")
    threshold = parse_severity(fail_on.value, "--fail-on") if fail_on else (cfg.fail_on or parse_severity("warning", ""))
    if changed_since and paths == ["-"]:
        raise UserError("--changed-since cannot be used with `-` (standard input)")
    only = changed_files(changed_since, Path(paths[0])) if changed_since else None
    try:
        result, _ = _run(paths, cfg, stdin_filename=stdin_filename, want_diff=False,
                      bar=_Progress(progress, verbose, "checking"), unsafe_fixes=unsafe_fixes, select=sel,
                      ignore=ign, exclude=exclude or (), only=only, jobs=jobs or None)
    except KeyboardInterrupt:
        _interrupted(None, writes=False)
    if _nothing_found(result, paths):
        return
    failing = [f for f in result.findings if f.severity >= threshold]
    if fmt == CheckFormat.json:
        doc = rep.to_json(result, "check")
        doc["fail_on"] = str(threshold)
        doc["failed"] = bool(failing)
        text = json.dumps(doc, indent=2) + "\n"
    elif fmt == CheckFormat.sarif:
        text = json.dumps(rep.to_sarif(result), indent=2) + "\n"
    elif fmt == CheckFormat.github:
        text = "".join(line + "\n" for line in rep.to_github(result))
    else:
        lines = rep.statistics_lines(result) if statistics else rep.finding_lines(result, "check")
        text = "".join(line + "\n" for line in lines)
        if not quiet:
            text += ("\n" if lines else "") + _check_tail(result, lines, failing, threshold)
    if output is not None:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as e:
            raise UserError(f"cannot write {output}: {e.strerror}") from None
    else:
        _write(text)
    if fmt == CheckFormat.text:
        _notes(result, quiet, verbose)
    if failing and not exit_zero:
        raise typer.Exit(1)


def _check_tail(result, lines: list[str], failing: list, threshold) -> str:
    """The legend and the one-line verdict printed after check's findings."""
    from tputool.codemods import report as rep

    s = rep.summary(result)
    sev = ", ".join(f"{v} {k}" for k, v in s["by_severity"].items())
    verdict = f"FAILED: {len(failing)} at or above {threshold}" if failing else f"passed (fail-on {threshold})"
    skipped = sum(s["skipped"].values())
    tail = (f"{s['findings']} finding(s) in {s['files_scanned']} file(s) ({sev}); "
            + (f"{skipped} file(s) skipped unread; " if skipped else "")
            + f"{s['fixes_applied']} fixable by `tputool port`; {verdict}")
    legend = [f"{t} {what}" for t, what in (("[*]", "fixed by `tputool port`"),
                                             ("[unsafe-fix]", "fixed by `tputool port --unsafe-fixes`"))
              if any(f" {t} " in line for line in lines)]
    return ("; ".join(legend) + "\n" if legend else "") + tail + "\n"


def _rule_json(rule, command: str) -> dict:
    return {"code": rule.code, "name": rule.name, "class": rule.rule_class.value, "fix": rule.fix.value,
            "severity": str(rule.severity), "reported_by": command, "message": rule.message, "doc": rule.doc,
            "patterns": list(rule.patterns)}


@_user_errors
def rules(
    code: str | None = typer.Argument(None, help="A rule code (e.g. TPU101) to print its documentation."),
    fmt: RulesFormat = typer.Option(RulesFormat.text, "--format", case_sensitive=False, help="Output format."),
) -> None:
    """List every rule (code, name, class, fix safety, severity), or print one rule's documentation."""
    from rich.console import Console
    from rich.table import Table

    from tputool.rules.catalogue import get_rule, listed_rules

    out = Console(highlight=False, soft_wrap=True)
    if code is not None:
        r = get_rule(code)
        if fmt == RulesFormat.json:
            _write(json.dumps(_rule_json(r, listed_rules()[r.code][1]), indent=2) + "\n")
            return
        typer.echo(f"{r.code} {r.name}")
        typer.echo(f"class: {r.rule_class.value}   fix: {r.fix.value}   severity: {r.severity}")
        if r.patterns:
            typer.echo(f"cuda-patterns rows: {', '.join(map(str, r.patterns))}")
        typer.echo("")
        typer.echo(r.message)
        typer.echo("")
        typer.echo(r.doc)
        return
    if fmt == RulesFormat.json:
        _write(json.dumps([_rule_json(r, cmd) for r, cmd in listed_rules().values()], indent=2) + "\n")
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
