"""One exception type for problems the user can fix (bad paths, bad data, mismatched caches).

The CLI prints these as a single line and exits non-zero; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback: a line break in its message
    (one inside a quoted name from a file, say) is shown as a space, so the message is one line wherever it is
    printed."""

    def __str__(self) -> str:
        return " ".join(super().__str__().splitlines())


def first_line(message: BaseException | str) -> str:
    """The first line of a message (libraries' messages can span many, tracebacks included); an exception
    without a message gives its type name, so a one-line error always says something."""
    text = str(message).strip()
    if text:
        return text.splitlines()[0]
    return type(message).__name__ if isinstance(message, BaseException) else ""


def one_line(exc: BaseException) -> str:
    """The whole message with its line breaks folded into spaces, for short messages whose detail is on
    their second line (transformers' config validation: ``Validation error for field 'x':`` then why)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def internal_error(exc: BaseException) -> str:
    """A bug's one line where a view shows it (the dashboard, the explorer): named as one, the view still working."""
    return f"internal error ({type(exc).__name__}: {exc}); the session keeps working"
