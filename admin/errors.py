"""The one error type of ``herd groups``."""


class CliError(Exception):
    """A mistake the user can fix, or a server that cannot be reached: printed as one line, exit code 2."""
