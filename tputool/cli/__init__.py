"""The `tputool` command line: a thin Typer app; each command lives in its own module of this package and calls
a library function and prints. Libraries hold no Typer code."""

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


from tputool.cli import diagnose as _diagnose  # noqa: E402
from tputool.cli import port as _port  # noqa: E402
from tputool.cli import profile as _profile  # noqa: E402
from tputool.cli import run as _run  # noqa: E402
from tputool.cli import tune as _tune  # noqa: E402

_port.register(app)  # port, check, rules
_diagnose.register(app)
_profile.register(app)
_tune.register(app)
_run.register(app)


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
