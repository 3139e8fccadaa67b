"""The `tputool parity` command: runs a script on the reference device and on tpu, reports the first departure."""

from __future__ import annotations

import typer

from tputool.cli.choices import TextOrJson
from tputool.errors import UserError

HELP = """Run SCRIPT on the reference device (its `tpu` mapped to CPU) and on tpu, with the same seeds and data,
and report the first module output or gradient that departs beyond what the dtypes explain: the user's line,
the first ATen op inside the module (replayed op by op on the same inputs), the error (abs, rel, ULPs), the
tolerance assert_close would need, and the known cause (device-branch, bf16-autocast, matmul-precision,
random-op, cpu-fallback, reduction-order, input-data).

`tputool parity record SCRIPT --out ref.pt` runs only the reference side (on cuda where there is one, else
cpu) and saves it; `tputool parity SCRIPT --reference ref.pt` compares a tpu run against it.

Exit status: 0 no departure; 1 a departure; 2 usage error; the script's own status when it failed
(124 timeout, 130 interrupted, 128+N killed by signal N)."""


def parity(
    ctx: typer.Context,
    script: str = typer.Argument(..., help="The script (or `record SCRIPT`); its arguments go after `--`."),
    steps: int = typer.Option(3, "--steps", help="Record the first N steps (optimizer steps, or model calls)."),
    reference: str | None = typer.Option(None, "--reference", help="Compare against this saved reference."),
    out: str | None = typer.Option(None, "--out", help="With `record`: where to save the reference."),
    fp32: bool = typer.Option(False, "--reference-fp32", help="Run the reference without autocast (float32)."),
    slack: float | None = typer.Option(None, "--slack", help="Tolerance factor over assert_close's defaults "
                                       "(default 8, times 1+step)."),
    device: str | None = typer.Option(None, "--device", help="With `record`: the reference device (cpu, cuda)."),
    timeout: float = typer.Option(600.0, "--timeout", help="Stop each run after this many seconds."),
    device_random: bool = typer.Option(False, "--device-random", help="The tpu run's random ops draw from the "
                                       "tpu's own stream (default: from the CPU generator, as the reference's, "
                                       "so dropout masks, noise and initializations are the same)."),
    fmt: TextOrJson = typer.Option(TextOrJson.text, "--format", help="text or json (schema tputool.parity/1)."),
    html_out: str | None = typer.Option(None, "--html", help="Also write the report as one self-contained HTML "
                                        "page with plots (needs matplotlib: the report extra)."),
) -> None:
    from tputool.parity import parity as run_parity
    from tputool.parity import record_reference
    from tputool.parity.report import exit_status, render_text, to_json

    args = list(ctx.args)
    if args and args[0] == "--":
        args = args[1:]
    if script == "record":
        if html_out is not None:
            raise UserError("--html goes with a comparison, not with `tputool parity record`")
        if not args:
            raise UserError("parity record needs a SCRIPT")
        if out is None:
            raise UserError("parity record needs --out FILE")
        script, args = args[0], args[1:]
        if args and args[0] == "--":
            args = args[1:]
        rec = record_reference(script, args, out, steps=steps, timeout_s=timeout, target=device, fp32=fp32,
                               quiet=fmt == "json")
        if fmt == "json":
            import json

            typer.echo(json.dumps({"schema": "tputool.parity-record-run/1", **rec}, indent=2, default=str))
        else:
            typer.echo(f"recorded {rec['records']} records of {rec['steps']} step(s) on {rec['device']} "
                       f"-> {rec['out']} (status {rec['status']})")
        from tputool.diagnose.exits import run_ending

        status = run_ending(rec["status"], rec["exit_code"])
        if status:
            raise typer.Exit(status)
        return
    if out is not None or device is not None:
        raise UserError("--out and --device go with `tputool parity record`")
    if html_out is not None:
        from tputool.reports import prepare

        html_out = prepare(html_out)
    report = run_parity(script, args, reference=reference, steps=steps, timeout_s=timeout, fp32=fp32, slack=slack,
                        quiet=fmt == "json", device_random=device_random)
    if fmt == "json":
        typer.echo(to_json(report))
    else:
        render_text(report, typer.echo)
    if html_out is not None:
        import json

        from tputool.reports import parity as html_report
        from tputool.reports import write

        write(html_out, html_report.render(json.loads(to_json(report))))
        typer.echo(f"wrote {html_out}", err=True)
    status = exit_status(report)
    if status:
        raise typer.Exit(status)


def register(app: typer.Typer) -> None:
    """Add `tputool parity` to the tputool app."""
    app.command("parity", help=HELP,
                context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(parity)
