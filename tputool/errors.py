"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class UserError(Exception):
    """Bad input from the user (a missing path, a bad option, an unknown rule): shown as one line, exit 2."""

    exit_code = 2
