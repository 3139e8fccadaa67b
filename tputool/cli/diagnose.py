"""The `tputool diagnose` command: runs a script on the tpu backend and prints tputool.diagnose's report."""

from __future__ import annotations

import typer

from tputool.cli.choices import FailOn, TextOrJson


def diagnose(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script to run (arguments for it go after `--`)."),
    timeout: float = typer.Option(600.0, "--timeout", help="Stop the script after this many seconds."),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Stop cleanly after N optimizer steps."),
    static: bool = typer.Option(False, "--static", help="Only the static analysis; do not run the script."),
    no_static: bool = typer.Option(False, "--no-static", help="Skip the static analysis of the script."),
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text or json (schema tputool.diagnose/1)."),
    compare_compiled: bool = typer.Option(True, "--compare-compiled/--no-compare-compiled",
                                          help="Time a few steps with the models under torch.compile (a second "
                                          "short run) to rank that advice by its measured saving."),
    fail_on: FailOn = typer.Option(FailOn.warning, "--fail-on", case_sensitive=False,
                                   help="Exit 1 on runtime findings of this severity or worse: info, warning, error."),
) -> None:
    from tputool.diagnose import diagnose as run_diagnose
    from tputool.diagnose.exits import exit_status
    from tputool.diagnose.report import render_text, to_json
    from tputool.rules.model import Severity

    threshold = {str(s): s for s in Severity}[fail_on.value]
    args = list(ctx.args)
    if args and args[0] == "--":
        args = args[1:]
    report = run_diagnose(script, args, timeout_s=timeout, max_steps=max_steps, static_only=static,
                          include_static=not no_static, script_output_to_stderr=fmt == "json",
                          compare_compiled=compare_compiled)
    if fmt == "json":
        typer.echo(to_json(report))
    else:
        from rich.console import Console

        render_text(report, Console(highlight=False, soft_wrap=True))
    status = exit_status(report, threshold)
    if status:
        raise typer.Exit(status)


def _help() -> str:
    from tputool.diagnose.exits import TABLE

    lines = "\n".join(ln.rstrip() for ln in TABLE.splitlines())
    return ("Run SCRIPT on the tpu backend and report what slows it: graph breaks, recompiles, host syncs, ...\n\n"
            f"Exit status:\n\n\b\n{lines}")


def register(app: typer.Typer) -> None:
    """Add `tputool diagnose` to the tputool app."""
    app.command("diagnose", help=_help(),
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(diagnose)
