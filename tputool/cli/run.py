"""The `tputool run` command: runs a script with a tuned configuration active (tputool.tune.run)."""

from __future__ import annotations

import typer


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


def register(app: typer.Typer) -> None:
    """Add `tputool run` to the tputool app."""
    app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run_cmd)
