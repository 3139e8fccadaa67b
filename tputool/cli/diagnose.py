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
    html_out: str | None = typer.Option(None, "--html", help="Also write the report as one self-contained HTML "
                                        "page with plots (needs matplotlib: the report extra)."),
    target: str | None = typer.Option(None, "--target", help="Check the step for this TPU slice (v5e-8, v6e-256, "
                                      "v5e-1 ...) by compiling it with the TPU compiler, without a TPU or data "
                                      "(needs the tpu-compile extra)."),
    steps: int = typer.Option(1, "--steps", help="With --target: the optimizer steps to check (the script stops after them)."),
    batch_arg: str | None = typer.Option(None, "--batch-arg", help="With --target: the script's option that sets "
                                         "the micro batch (e.g. --batch_size), to search the largest that fits."),
    config: str | None = typer.Option(None, "--config", help="With --target: a tputool-tune.yaml applied to the "
                                      "script, as `tputool run --config` does (its mesh over the slice's chips)."),
) -> None:
    from tputool.diagnose import diagnose as run_diagnose
    from tputool.diagnose.exits import exit_status
    from tputool.diagnose.report import render_text, to_json
    from tputool.rules.model import Severity

    threshold = {str(s): s for s in Severity}[fail_on.value]
    if html_out is not None and target is not None:
        from tputool.errors import UserError

        raise UserError("--html does not cover --target yet: use --format json for the target check's figures")
    if html_out is not None:
        from tputool.reports import prepare

        html_out = prepare(html_out)
    args = list(ctx.args)
    if args and args[0] == "--":
        args = args[1:]
    if config is not None and target is None:
        from tputool.errors import UserError

        raise UserError("--config applies with --target (to run with a tuned config: tputool run --config)")
    if target is not None:
        _diagnose_target(script, args, target, steps, timeout, batch_arg, fmt, config)
        return
    report = run_diagnose(script, args, timeout_s=timeout, max_steps=max_steps, static_only=static,
                          include_static=not no_static, script_output_to_stderr=fmt == "json",
                          compare_compiled=compare_compiled)
    if fmt == "json":
        typer.echo(to_json(report))
    else:
        from rich.console import Console

        render_text(report, Console(highlight=False, soft_wrap=True))
    if html_out is not None:
        import json

        from tputool.reports import diagnose as html_report
        from tputool.reports import write

        write(html_out, html_report.render(json.loads(to_json(report))))
        typer.echo(f"wrote {html_out}", err=True)
    status = exit_status(report, threshold)
    if status:
        raise typer.Exit(status)


def _diagnose_target(script: str, args: list[str], target: str, steps: int, timeout: float, batch_arg: str | None,
                     fmt: TextOrJson, config: str | None = None) -> None:
    import json

    from tputool.diagnose.target import check_target, exit_status, render_text

    result = check_target(script, args, target, steps=steps, timeout_s=timeout, batch_arg=batch_arg, config=config)
    typer.echo(json.dumps({"target": result}, indent=2) if fmt == "json" else render_text(result))
    status = exit_status(result)
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
