"""The `tputool launch` command: the same script on every host of a TPU slice (or several), written for a
launcher (tputool.launch.writers) or rehearsed on this machine (tputool.launch.local)."""

from __future__ import annotations

import shlex
from enum import StrEnum
from pathlib import Path

import typer


class Via(StrEnum):
    jobset = "jobset"
    xpk = "xpk"
    gcloud = "gcloud"
    ray = "ray"
    local = "local"


def launch_cmd(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The training script (its arguments follow it)."),
    target: str = typer.Option(..., "--target", help="The slice: v5p-32, v5litepod-16 / v5e-16, v6e-256, tpu7x-8, "
                                                       "v6e-256x2 (two slices)."),
    via: Via = typer.Option(..., "--via", help="Who starts the hosts: a JobSet manifest, xpk, gcloud ssh, a Ray "
                                               "job, or local processes here."),
    image: str = typer.Option(None, "--image", help="jobset/xpk: the container image (with tputool and the script)."),
    tpu_name: str = typer.Option(None, "--tpu-name", help="gcloud: the TPU VM (queued resource for several slices)."),
    zone: str = typer.Option(None, "--zone", help="gcloud/xpk: the zone."),
    project: str = typer.Option(None, "--project", help="gcloud/xpk: the project."),
    cluster: str = typer.Option(None, "--cluster", help="xpk: the GKE cluster."),
    name: str = typer.Option(None, "--name", help="The job's name (default: from the script's name)."),
    config: str = typer.Option(None, "--config", help="A tputool-tune.yaml: carried in the command, active on "
                                                       "every host."),
    master_port: int = typer.Option(None, "--master-port", help="The c10d store's port on the first host "
                                                                 "(default 29500; local: a free one)."),
    out: Path = typer.Option(None, "--out", help="Write the manifest/command/job here instead of stdout."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what would run; start nothing (local)."),
) -> None:
    """Write the launch of SCRIPT on every host of --target for --via's launcher (stdout or --out), or run the
    slice's process layout here (--via local)."""
    from tputool.launch.writers import gcloud, jobset_yaml, make_launch, ray_json, xpk
    from tputool.tune.slices import parse_target

    sl = parse_target(target)
    args = list(ctx.args)
    if via is Via.local:
        from tputool.backend.distributed.jax_runtime import _free_port as free_port
        from tputool.launch.local import host_environments, run_local

        lc = make_launch(sl, script, args, name, None, config, master_port or free_port())
        if not Path(script).is_file():
            raise typer.BadParameter(f"{script}: no such script", param_hint="SCRIPT")
        if dry_run:
            for env in host_environments(lc, {}):
                typer.echo(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()) + " " + lc.host_command())
            return
        typer.echo(f"tputool launch: {sl.name} here: {sl.hosts * sl.slices} host process(es) x "
                   f"{sl.chips_per_host * sl.chip.devices_per_chip} CPU device(s)", err=True)
        code = run_local(lc)
        typer.echo(f"tputool launch: {script} on {sl.name} " + ("finished" if code == 0 else "failed"), err=True)
        raise typer.Exit(code)
    lc = make_launch(sl, script, args, name, image, config, master_port)
    if via is Via.jobset:
        text = jobset_yaml(lc)
    elif via is Via.ray:
        text = ray_json(lc) + "\n"
    elif via is Via.xpk:
        text = shlex.join(xpk(lc, cluster, project, zone)) + "\n"
    else:
        text = shlex.join(gcloud(lc, tpu_name, zone, project)) + "\n"
    if out is not None and not dry_run:
        out.write_text(text)
        typer.echo(f"tputool launch: wrote {out} ({sl.name}: {sl.slices} slice(s) x {sl.hosts} host(s) x "
                   f"{sl.chips_per_host} chips, {sl.machine_type})", err=True)
    else:
        typer.echo(text, nl=False)


def register(app: typer.Typer) -> None:
    """Add `tputool launch` to the tputool app."""
    app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(launch_cmd)
