"""Choice options shared by several commands, as Typer enums (a bad value is a usage error, exit status 2)."""

from __future__ import annotations

import enum


class FailOn(enum.StrEnum):
    """--fail-on: the least severity that makes the command exit 1."""

    error = "error"
    warning = "warning"
    info = "info"


class TextOrJson(enum.StrEnum):
    """--format of diagnose, parity and rules: human text or a JSON document."""

    text = "text"
    json = "json"
