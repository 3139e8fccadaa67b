"""The `tputool` command line: a thin Typer app; each command lives in its own module of this package and calls
a library function and prints. Libraries hold no Typer code."""

from __future__ import annotations

import re
import sys
from typing import Any

import typer

try:
    from typer._click import (
        exceptions as _click_errors,  # Typer >= 0.29 vendors click; its exceptions live here
    )
except ImportError:  # older Typer runs on the installed click
    from click import exceptions as _click_errors
from typer.core import TyperGroup

from tputool import __version__
from tputool.errors import UserError


class _NoSuchError(Exception):
    """Stands in for an exception the installed click lacks (NoArgsIsHelpError is click >= 8.2)."""


_NO_ARGS_IS_HELP: type[Exception] = getattr(_click_errors, "NoArgsIsHelpError", _NoSuchError)
_USAGE_ERROR: type[Exception] = getattr(typer, "TyperException", None) or _click_errors.ClickException
_NOT_ONE_OF = re.compile(r"^(?:Value error, )?(.*) is not one of (.*?)\.?$")


def _param_name(param: Any) -> str:
    """An argument's name as usage text shows it (SCRIPT); Typer 0.29's arguments lack click's human_readable_name."""
    name = getattr(param, "human_readable_name", None) or param.metavar or (param.name or "argument").upper()
    return str(name)


def _one_line(e: Exception) -> str:
    """A Typer/click usage error as `error: ...` on one line, in the words tputool's own errors use."""
    param = getattr(e, "param", None)
    if isinstance(e, _click_errors.MissingParameter) and param is not None:
        kind = "option" if param.param_type_name == "option" else "argument"
        shown = max(param.opts, key=len) if kind == "option" and param.opts else _param_name(param)
        return f"error: missing {kind} {shown}"
    msg = e.message if isinstance(e, _click_errors.BadParameter) else e.format_message()
    if isinstance(e, _click_errors.BadParameter) and param is not None:
        name = max(param.opts, key=len) if param.param_type_name == "option" and param.opts else \
            _param_name(param)
        m = _NOT_ONE_OF.match(msg)
        msg = (f"{name} must be one of {m.group(2).replace(chr(39), '')}, not {m.group(1)}" if m
               else f"invalid value for {name}: {msg}")
    msg = " ".join(str(msg).split())
    return f"error: {msg[:1].lower() + msg[1:]}"


def _metavar(param: Any) -> str:
    """The help column for one parameter: nothing for a flag, else a word (never a Python type name)."""
    if getattr(param, "is_flag", False) or getattr(param, "count", False):
        return ""
    desc = getattr(param, "type_descriptor", None)
    if desc is not None and desc.choices:
        return "|".join(str(getattr(c, "value", c)) for c in desc.choices)
    many = param.nargs != 1 or bool(getattr(param, "multiple", False))
    if param.param_type_name == "argument":
        return (param.name or "arg").upper().removesuffix("S") if many else (param.name or "arg").upper()
    annotation = getattr(desc, "annotation", str)
    inner = annotation.__args__[0] if many and getattr(annotation, "__args__", None) else annotation
    if desc is not None and desc.is_path:
        return "PATH"
    return {int: "N", float: "NUM", bool: "BOOL"}.get(inner, "TEXT")


def _flag_help(make: Any) -> Any:
    """Wrap a command's get_help_option so --help shows no type either."""

    def get_help_option(ctx: Any) -> Any:
        opt = make(ctx)
        if opt is not None:
            opt.metavar = ""
        return opt

    return get_help_option


class _App(TyperGroup):
    """The tputool group: help without Python type names, and every usage error as one `error: ...` line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in (self, *self.commands.values()):
            command.get_help_option = _flag_help(command.get_help_option)
            for param in command.params:
                if param.metavar is None:
                    param.metavar = _metavar(param)
                if param.param_type_name == "argument":
                    param.display_type_rich = lambda ctx: None  # the name column already says it

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS_IS_HELP as e:
            text = e.format_message()  # with rich, the help was printed when the error was made
            if text.strip():
                typer.echo(text)
            sys.exit(e.exit_code)
        except _USAGE_ERROR as e:
            typer.echo(_one_line(e), err=True)
            sys.exit(2 if isinstance(e, _click_errors.UsageError) else e.exit_code)
        except typer.Abort:
            typer.echo("error: aborted", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    cls=_App,
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
from tputool.cli import launch as _launch  # noqa: E402
from tputool.cli import parity as _parity  # noqa: E402
from tputool.cli import port as _port  # noqa: E402
from tputool.cli import profile as _profile  # noqa: E402
from tputool.cli import run as _run  # noqa: E402
from tputool.cli import tune as _tune  # noqa: E402

_port.register(app)  # port, check, rules
_diagnose.register(app)
_parity.register(app)
_profile.register(app)
_tune.register(app)
_run.register(app)
_launch.register(app)


def main() -> None:
    """Console-script entry point: usage and user errors become one `error: ...` line and exit status 2.

    A UserError raised by a command passes through the app (tests see it as the result's exception) and is
    printed here, in the same style as the usage errors `_App.main` prints.
    """
    try:
        app()
    except UserError as e:
        typer.echo(f"error: {e}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)
