"""Error types: a `UserError` is bad input, reported as one line before any work starts."""


class UserError(Exception):
    """Bad input from the user (config, command line, experiment file).

    The CLI prints it as a single ``ppx: error: ...`` line and exits with status 2.
    """


class ScheduleError(UserError):
    """An action list that cannot run (wrong order, unmatched send/recv, deadlock)."""


def first_line(e: BaseException | str) -> str:
    """``e``'s message (or a text) in one line: its first non-blank line, with the next one
    where the first only announces it (ends in ':'); "" for an exception raised without a
    message."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} {lines[1]}"
    return lines[0] if lines else ""


def said(e: BaseException) -> str:
    """``Type: its first line`` (`first_line`), or just ``Type`` where it said nothing, for
    one-line errors."""
    line = first_line(e)
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def os_words(e: OSError) -> str:
    """An OSError as the OS says it, with the file it names: ``File too large: <path>``."""
    return f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
