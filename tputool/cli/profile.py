"""The `tputool profile` command: traces a model or script with tputool.profile and prints the summary."""

from __future__ import annotations

import sys

import typer

from tputool.errors import UserError


def profile_cmd(
    script: str = typer.Argument(None, help="A Python script to run under the profiler (or use --model)."),
    model: str = typer.Option(None, "--model", help="Built-in model (llama, moe, mlp, cnn, vit) or file.py:build_fn."),
    steps: int = typer.Option(5, "--steps", min=1, help="Training steps to trace (--model)."),
    out: str = typer.Option("tputool-profile", "--out", help="Trace directory (TensorBoard/Perfetto)."),
    cpu_devices: int = typer.Option(None, "--cpu-devices", min=1, help="Simulate N CPU devices (before JAX starts)."),
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
    from tputool.profile.run import profile_script
    from tputool.tune.api import profile_model

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


def register(app: typer.Typer) -> None:
    """Add `tputool profile` to the tputool app."""
    app.command("profile")(profile_cmd)
