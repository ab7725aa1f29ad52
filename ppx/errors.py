"""Error types: a `UserError` is bad input, reported as one line before any work starts."""


class UserError(Exception):
    """Bad input from the user (config, command line, experiment file).

    The CLI prints it as a single ``ppx: error: ...`` line and exits with status 2.
    """


class ScheduleError(UserError):
    """An action list that cannot run (wrong order, unmatched send/recv, deadlock)."""
