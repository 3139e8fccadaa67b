"""The `tputool` command line: a thin Typer app; every command calls a library function and prints."""

from __future__ import annotations

import sys

import typer

from tputool import __version__
from tputool.errors import UserError

app = typer.Typer(
    name="tputool",
    help="Port CUDA PyTorch code to TPUs, gate it in CI, and run, diagnose, profile and tune it on the tpu device.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tputool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """tputool: CUDA-to-TPU porting assistant and toolchain."""


# ---- port / check / rules (tputool.codemods) ----------------------------------------------------
from tputool.codemods.commands import register as _register_codemods  # noqa: E402

_register_codemods(app)

# ---- diagnose (tputool.diagnose) -----------------------------------------------------------------


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def diagnose(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script to run (arguments for it go after `--`)."),
    timeout: float = typer.Option(600.0, "--timeout", help="Stop the script after this many seconds."),
    max_steps: int | None = typer.Option(None, "--max-steps", help="Stop cleanly after N optimizer steps."),
    static: bool = typer.Option(False, "--static", help="Only the static analysis; do not run the script."),
    no_static: bool = typer.Option(False, "--no-static", help="Skip the static analysis of the script."),
    fmt: str = typer.Option("text", "--format", help="text or json (schema tputool.diagnose/1)."),
    fail_on: str | None = typer.Option(None, "--fail-on", help="Also exit 1 on findings of this severity "
                                       "or worse: info, warning, error."),
) -> None:
    """Run SCRIPT on the tpu backend and report what slows it: graph breaks, recompiles, host syncs, ..."""
    from tputool.codemods.model import Severity
    from tputool.diagnose import diagnose as run_diagnose
    from tputool.diagnose.report import render_text, to_json

    if fmt not in ("text", "json"):
        raise UserError(f"--format must be text or json, not {fmt!r}")
    threshold = None
    if fail_on is not None:
        names = {str(s): s for s in Severity}
        if fail_on.lower() not in names:
            raise UserError(f"--fail-on must be one of {', '.join(names)}, not {fail_on!r}")
        threshold = names[fail_on.lower()]
    args = list(ctx.args)
    if args and args[0] == "--":
        args = args[1:]
    report = run_diagnose(script, args, timeout_s=timeout, max_steps=max_steps, static_only=static,
                          include_static=not no_static, script_output_to_stderr=fmt == "json")
    if fmt == "json":
        typer.echo(to_json(report))
    else:
        from rich.console import Console

        render_text(report, Console(highlight=False, soft_wrap=True))
    if report.script_failed:
        raise typer.Exit(1)
    if threshold is not None and any(f.severity >= threshold for f in report.findings):
        raise typer.Exit(1)


# ---- profile / tune / run (tputool.profile, tputool.tune) ----------------------------------------


@app.command("profile")
def profile_cmd(
    script: str = typer.Argument(None, help="A Python script to run under the profiler (or use --model)."),
    model: str = typer.Option(None, "--model", help="Built-in model (llama, moe, mlp, cnn, vit) or file.py:build_fn."),
    steps: int = typer.Option(5, "--steps", help="Training steps to trace (--model)."),
    out: str = typer.Option("tputool-profile", "--out", help="Trace directory (TensorBoard/Perfetto)."),
    cpu_devices: int = typer.Option(None, "--cpu-devices", help="Simulate N CPU devices (before JAX starts)."),
    config: str = typer.Option(None, "--config", help="Profile the configuration of a tputool-tune.yaml."),
    set_: list[str] = typer.Option([], "--set", help="Model config override FIELD=VALUE (repeatable)."),
) -> None:
    """Trace a model's training step or a script with jax.profiler; print step/compute/collective time and top ops."""
    from tputool.profile.devices import use_cpu_devices
    from tputool.tune.cli_args import parse_overrides

    if (script is None) == (model is None):
        raise UserError("give either a script path or --model NAME")
    use_cpu_devices(cpu_devices)
    from tputool.profile.report import print_summary
    from tputool.profile.run import profile_model, profile_script

    if model is not None:
        cand = None
        if config:
            from tputool.tune.config import load_config

            cand = load_config(config).candidate
        summary = profile_model(model, steps, out, cand, parse_overrides(set_))
    else:
        summary = profile_script(script, [], out)
    import jax
    from rich.console import Console

    console = Console() if sys.stdout.isatty() else Console(width=160)
    print_summary(summary, console, cpu=jax.devices()[0].platform == "cpu")


@app.command("tune")
def tune_cmd(
    model: str = typer.Option("llama", "--model", help="Built-in model name or path/to/module.py:build_fn."),
    target: str = typer.Option(None, "--target", help="Predict for a TPU slice (v5e-256, v6e-8, v7x-128, v5e:2x4) "
                               "instead of measuring here."),
    out: str = typer.Option("tputool-tune.yaml", "--out", help="Where to write the winning configuration."),
    cpu_devices: int = typer.Option(None, "--cpu-devices", help="Measure on N simulated CPU devices."),
    fraction: float = typer.Option(1 / 3, "--fraction", help="Largest share of candidates to run (measured mode)."),
    batch: str = typer.Option("1,2,4", "--batch", help="Batch sizes per data shard to try."),
    remat: str = typer.Option("none,save-dots,full", "--remat", help="Remat policies to try."),
    attention: str = typer.Option("plain,chunked:16", "--attention", help="Attention implementations to try."),
    precision: str = typer.Option("bf16,fp32", "--precision", help="Compute precisions to try."),
    max_tensor: int = typer.Option(None, "--max-tensor", help="Largest tensor-parallel axis to consider."),
    mesh: str = typer.Option(None, "--mesh", help="Only these meshes, e.g. d8f1t1,d2f4t1 (default: all)."),
    hbm_gb: float = typer.Option(None, "--hbm-gb", help="Memory per device for measured mode (GB)."),
    steps: int = typer.Option(3, "--steps", help="Profiled steps per measured candidate."),
    set_: list[str] = typer.Option([], "--set", help="Model config override FIELD=VALUE (repeatable)."),
    limit: int = typer.Option(15, "--show", help="Rows of the ranked table to print."),
) -> None:
    """Search mesh, batch, remat, attention and precision; write the winner to tputool-tune.yaml."""
    from tputool.profile.devices import host_only_jax, use_cpu_devices
    from tputool.tune.cli_args import build_space, parse_overrides

    space = build_space(batch, remat, attention, precision, max_tensor, mesh)
    if target is None:
        use_cpu_devices(cpu_devices)
    else:
        host_only_jax()
    from rich.console import Console
    from rich.progress import Progress

    from tputool.tune.api import tune_model
    from tputool.tune.config import write_config
    from tputool.tune.report import print_result

    console = Console() if sys.stdout.isatty() else Console(width=160)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("measuring" if target is None else "compiling for TPU", total=None)

        def progress(row, i, n):
            bar.update(task, total=n, completed=i, description=f"{row.candidate.key}: {row.status}")

        result = tune_model(model, target=target, overrides=parse_overrides(set_), space=space, fraction=fraction,
                            hbm_bytes=hbm_gb * 1e9 if hbm_gb else None, steps=steps, progress=progress)
    print_result(result, console, limit)
    if result.winner is not None:
        console.print(f"wrote {write_config(result, out)}")


@app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run_cmd(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script to run."),
    config: str = typer.Option(..., "--config", help="A tputool-tune.yaml written by `tputool tune`."),
    cpu_devices: int = typer.Option(None, "--cpu-devices", help="Simulate N CPU devices (before JAX starts)."),
) -> None:
    """Run SCRIPT with a tuned configuration active (tputool.tune.active_config(); TPUTOOL_TUNE_CONFIG)."""
    from tputool.profile.devices import use_cpu_devices
    from tputool.tune.run import run_script

    use_cpu_devices(cpu_devices)

    cfg = run_script(script, list(ctx.args), config)
    typer.echo(f"tputool run: finished {script} with {cfg.candidate.key}", err=True)



def main() -> None:
    """Console-script entry point: user errors become one line on stderr and exit status 2."""
    try:
        app()
    except UserError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
