"""One exception type for problems the user can fix (bad paths, bad data, mismatched caches).

The CLI prints these as a single line and exits non-zero; anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""
