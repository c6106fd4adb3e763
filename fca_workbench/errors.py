"""One exception type for problems the user can fix (bad paths, bad data, mismatched caches).

The CLI prints these as a single line and exits non-zero; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""


def first_line(exc: Exception) -> str:
    """The first line of an exception's message (libraries' messages can span many), or its type name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
