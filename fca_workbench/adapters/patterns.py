"""The ``--controllers`` / ``--only-controllers`` patterns: a regex over module paths, checked to match in
bounded time before it is ever run, so a user's pattern cannot hang an audit."""

import re
import re._constants as re_constants  # type: ignore[import-not-found]  # a pattern's parsed form (safe_pattern)
import re._parser as re_parser  # type: ignore[import-not-found]
from typing import Any

from fca_workbench.foundation.errors import UserError, first_line

MAX_PATH = 256  # module paths longer than this are never matched by --controllers (real ones are < 100)
MAX_UNBOUNDED = 3  # unbounded repeats a --controllers pattern may hold
_REPEATS = (re_constants.MAX_REPEAT, re_constants.MIN_REPEAT, re_constants.POSSESSIVE_REPEAT)


def safe_pattern(pattern: str, flag: str) -> str:
    """``pattern`` if it compiles and its match time is bounded, else a one-line UserError. Module paths are
    short (matched up to ``MAX_PATH`` characters), and the pattern may hold no repeat inside a repeat and no
    alternation inside a repeat (the shapes that backtrack exponentially, ``(a+)+``) and at most
    ``MAX_UNBOUNDED`` unbounded repeats (``.*``, ``+``), so a match takes at most ~MAX_PATH**3 steps."""
    try:
        re.compile(pattern)  # also what parsing alone lets through (a look-behind of varying width)
        parsed = re_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise UserError(f"{flag} '{pattern}' is not a regular expression: {first_line(exc)}") from None
    unbounded = _unbounded_repeats(parsed, pattern, flag, inside_repeat=False)
    if unbounded > MAX_UNBOUNDED:
        raise UserError(
            f"{flag} '{pattern}' has {unbounded} unbounded repeats (*, +); at most {MAX_UNBOUNDED} are allowed"
        )
    return pattern


def _unbounded_repeats(items: Any, pattern: str, flag: str, inside_repeat: bool) -> int:
    count = 0
    for op, av in items:
        if op in _REPEATS:
            _, high, body = av
            if inside_repeat and high > 1:
                raise UserError(f"{flag} '{pattern}' repeats a repeat (like (a+)+), which can take forever to match")
            count += (high == re_constants.MAXREPEAT) + _unbounded_repeats(
                body, pattern, flag, inside_repeat or high > 1
            )
        elif op == re_constants.BRANCH:
            if inside_repeat:
                raise UserError(f"{flag} '{pattern}' repeats an alternation (like (a|ab)*), which can take forever")
            count += sum(_unbounded_repeats(branch, pattern, flag, inside_repeat) for branch in av[1])
        elif op == re_constants.SUBPATTERN:
            count += _unbounded_repeats(av[-1], pattern, flag, inside_repeat)
        elif op in (re_constants.ASSERT, re_constants.ASSERT_NOT):
            count += _unbounded_repeats(av[1], pattern, flag, inside_repeat)
        elif op == re_constants.GROUPREF_EXISTS:
            count += sum(_unbounded_repeats(b, pattern, flag, inside_repeat) for b in av[1:] if b is not None)
    return count
