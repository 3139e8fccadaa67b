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

# ---- profile / tune / run (tputool.profile, tputool.tune) ----------------------------------------


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
