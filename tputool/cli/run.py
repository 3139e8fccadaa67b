"""The `tputool run` command: runs a script with a tuned configuration active (tputool.tune.run), and/or in N
local processes under torchrun's launcher (tputool.launch)."""

from __future__ import annotations

import typer


def run_cmd(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script to run."),
    config: str = typer.Option(None, "--config", help="A tputool-tune.yaml written by `tputool tune`."),
    cpu_devices: int = typer.Option(None, "--cpu-devices", min=1,
                                    help="Simulate N CPU devices (before JAX starts; per process with --nproc)."),
    nproc: int = typer.Option(None, "--nproc", min=1, help="Run N local processes under torchrun (RANK, WORLD_SIZE, ... "
                                                     "set): a dry run of a pod's process layout."),
    master_port: int = typer.Option(None, "--master-port", min=1, max=65535, help="With --nproc: torchrun's port (default: a free one)."),
) -> None:
    """Run SCRIPT with a tuned configuration active (tputool.tune.active_config(); TPUTOOL_TUNE_CONFIG), or in
    --nproc local processes under torchrun's launcher (either or both)."""
    if config is None and nproc is None:
        raise typer.BadParameter("give --config (a tuned configuration) or --nproc (local processes), or both")
    if nproc is not None:
        from tputool.launch import launch_local

        if config is not None:
            from tputool.tune.config import apply_config

            apply_config(config)  # (exported to the workers as TPUTOOL_TUNE_CONFIG)
        code = launch_local(script, list(ctx.args), nproc, cpu_devices, master_port)
        typer.echo(f"tputool run: {nproc} processes of {script} " + ("finished" if code == 0 else "failed"), err=True)
        raise typer.Exit(code)
    from tputool.profile.devices import use_cpu_devices
    from tputool.tune.run import run_script

    use_cpu_devices(cpu_devices)

    cfg = run_script(script, list(ctx.args), config)
    typer.echo(f"tputool run: finished {script} with {cfg.candidate.key}", err=True)


def register(app: typer.Typer) -> None:
    """Add `tputool run` to the tputool app."""
    app.command("run", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(run_cmd)
