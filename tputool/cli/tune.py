"""The `tputool tune` command: searches configurations with tputool.tune and writes the winner."""

from __future__ import annotations

import sys

import typer

from tputool.cli.choices import TextOrJson

NOTHING_FITS = 3
"""`tune`'s exit status when no candidate fits in memory (2 stays the usage error)."""

MEASURE_DEFAULT = 8
"""Candidates run by default in measured mode: enough for one per leading mesh shape and a few corrected picks,
few enough that a laptop answers in about a minute."""


def tune_cmd(
    model: str = typer.Option("llama", "--model", help="Built-in model name or path/to/module.py:build_fn."),
    target: str = typer.Option(None, "--target", help="Predict for a TPU slice (v5e-256, v6e-8, v7x-128, v5e:2x4) "
                               "instead of measuring here."),
    out: str = typer.Option("tputool-tune.yaml", "--out", help="Where to write the winning configuration."),
    cpu_devices: int = typer.Option(None, "--cpu-devices", min=1, help="Measure on N simulated CPU devices."),
    fraction: float = typer.Option(1 / 3, "--fraction", min=0.0, max=1.0, show_default="1/3", help="Largest share of candidates to run (measured mode)."),
    measure: int = typer.Option(MEASURE_DEFAULT, "--measure", min=1, help="Most candidates to run (measured mode): "
                                "the cost model chooses them; the rest are ranked by prediction only."),
    batch: str = typer.Option("1,2,4", "--batch", help="Batch sizes per data shard to try."),
    remat: str = typer.Option("auto", "--remat", help="Remat policies to try (none, save-dots, save-qkv, full, "
                              "offload); auto: all a mode can run."),
    attention: str = typer.Option("auto", "--attention", help="Attention implementations to try (plain, "
                                  "chunked:BLOCK, flash:BLOCK); auto: chosen from the sequence length."),
    precision: str = typer.Option("bf16,fp32", "--precision", help="Compute precisions to try."),
    max_tensor: int = typer.Option(None, "--max-tensor", min=1, help="Largest tensor-parallel axis to consider."),
    mesh: str = typer.Option(None, "--mesh", help="Only these meshes, e.g. d8f1t1,d2f4t1 (default: all)."),
    hbm_gb: float = typer.Option(None, "--hbm-gb", min=0.001, help="Memory per device for measured mode (GB)."),
    steps: int = typer.Option(3, "--steps", min=1, help="Profiled steps per measured candidate."),
    compile_top: int = typer.Option(3, "--compile-top", min=0, help="With --target and libtpu: compile this many "
                                    "of the best-ranked candidates for the slice to check they fit (0: estimate "
                                    "only, in seconds instead of minutes for a large model)."),
    set_: list[str] = typer.Option([], "--set", help="Model config override FIELD=VALUE (repeatable)."),
    global_batch: int = typer.Option(None, "--global-batch", min=1, help="Sequences per step (replaces --batch)."),
    calibration: str = typer.Option(None, "--calibration", help="Achievable fractions per chip (a YAML "
                                    "written by --calibrate); default: the fit on published runs."),
    calibrate: str = typer.Option(None, "--calibrate", help="Refit the fractions from a profiler trace "
                                  "directory of a real run, write them to --out, and report."),
    config: str = typer.Option(None, "--config", help="With --calibrate: the tputool-tune.yaml the traced run used."),
    limit: int = typer.Option(15, "--show", min=0, help="Rows of the ranked table to print."),
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text or json (schema tputool.tune/1)."),
    html_out: str = typer.Option(None, "--html", help="Also write the result as one self-contained HTML page "
                                 "with plots (needs matplotlib: the report extra)."),
) -> None:
    """Search mesh, batch, remat, attention and precision; write the winner to tputool-tune.yaml.

    Exit status: 0 wrote the winner; 2 usage error (bad option or --set) or no candidate ran;
    3 nothing fits in memory (the table says why and the smallest change that fits).
    """
    from tputool.profile.devices import host_only_jax, use_cpu_devices
    from tputool.tune.cli_args import build_space, parse_overrides

    if html_out is not None:
        from tputool.errors import UserError
        from tputool.reports import prepare

        if calibrate is not None:
            raise UserError("--html goes with a search, not with --calibrate")
        html_out = prepare(html_out)

    if calibrate is not None:
        from tputool.tune.trace_calibrate import calibrate_cmd

        calibrate_cmd(calibrate, model, parse_overrides(set_), out, target, cpu_devices, config)
        return
    space = build_space(batch, remat, attention, precision, max_tensor, mesh, global_batch)
    if target is None:
        use_cpu_devices(cpu_devices)
    else:
        host_only_jax()
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tputool.errors import UserError
    from tputool.tune.api import tune_model
    from tputool.tune.config import write_config
    from tputool.tune.report import print_result, to_json

    json_out = fmt == TextOrJson.json
    console = Console() if sys.stdout.isatty() else Console(width=160)
    # progress goes to stderr, and only to a terminal: piped or JSON output stays clean
    err = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=json_out or not err.is_terminal) as bar:
        task = bar.add_task("preparing: model, host calibration, predictions" if target is None
                            else "compiling for TPU", total=None)

        def progress(row, i, n):
            verb = "measuring" if target is None else "compiling"
            what = f"{verb} {row.candidate.key}" if row.status == "running" else f"{row.candidate.key}: {row.status}"
            bar.update(task, total=n, completed=i, description=what)

        result = tune_model(model, target=target, overrides=parse_overrides(set_), space=space, fraction=fraction,
                            hbm_bytes=hbm_gb * 1e9 if hbm_gb else None, steps=steps, compile_top=compile_top,
                            progress=progress,
                            calibration=calibration, top=measure)
    if json_out:
        typer.echo(to_json(result))
    else:
        print_result(result, console, limit)
    if html_out is not None:
        from tputool.reports import tune as html_report
        from tputool.reports import write

        (err if json_out else console).print(f"wrote {write(html_out, html_report.render(result, limit))}")
    if result.winner is None:
        if result.no_fit is not None:
            change = result.no_fit.change
            nothing_fits = UserError("nothing fits" + (f"; smallest change that fits: {change.what}" if change else ""))
            nothing_fits.exit_code = NOTHING_FITS
            raise nothing_fits
        raise UserError("no candidate ran successfully: nothing to write")
    (err if json_out else console).print(f"wrote {write_config(result, out)}")


def register(app: typer.Typer) -> None:
    """Add `tputool tune` to the tputool app."""
    app.command("tune")(tune_cmd)
