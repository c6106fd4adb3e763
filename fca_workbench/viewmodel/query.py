"""The dashboard's selection as URL query values, so that a view is a link a colleague can open.

``ViewQuery`` is what the app syncs with the URL both ways (``pn.state.location.sync``). Its parameters take
any value a link carries; nothing in a link reaches a widget unchecked: ``choose`` and ``choose_index`` accept
a value the server can show and otherwise answer the default with a one-line message, so a bad or stale link
gives a note and the default view, never a broken page.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import param

# parameter of ViewQuery -> name in the URL query
QUERY_NAMES = {
    "view": "view",
    "checkpoint": "checkpoint",
    "source": "source",
    "window": "window",
    "layer": "layer",
    "condition": "intervention",
    "seed": "seed",
    "donor": "donor",
    "heat_slot": "slot",
    "heat_layer": "heat_layer",
    "audit": "audit",
    "compare": "compare",
    "sort": "sort",
    "order": "order",
}
VIEWS = ("live", "results")
# the text a query runs on, as the choice shows it -> as a link names it (a link does not carry pasted text)
SOURCES = {"eval window": "window", "pasted text": "text"}
ALL_LAYERS = -1  # the layer choice "every layer at once": shown as ALL_LAYERS_LABEL, in a link layer=ALL_LAYERS_LINK
ALL_LAYERS_LABEL = "all layers"
ALL_LAYERS_LINK = "all"
AUDIT_DONOR = -1  # cross_input's donor: the audit's seeded derangement; in a link donor=AUDIT_DONOR_LINK
# a word, not -1: Panel re-reads the whole query at each change and turns "-1" into the float -1.0 (only digits
# are read as an int), so a negative number in the URL would come back as "-1.0" after a reload
AUDIT_DONOR_LINK = "audit"


class ViewQuery(param.Parameterized):
    """The selection in the URL. Untyped on purpose: whatever a link holds arrives here, then gets checked."""

    view = param.Parameter(default=None)
    checkpoint = param.Parameter(default=None)
    source = param.Parameter(default=None)
    window = param.Parameter(default=None)
    layer = param.Parameter(default=None)
    condition = param.Parameter(default=None)
    seed = param.Parameter(default=None)
    donor = param.Parameter(default=None)
    heat_slot = param.Parameter(default=None)
    heat_layer = param.Parameter(default=None)
    audit = param.Parameter(default=None)
    compare = param.Parameter(default=None)
    sort = param.Parameter(default=None)
    order = param.Parameter(default=None)

    def requested(self) -> dict:
        """The values the link carried (parameters it left out are absent)."""
        return {name: getattr(self, name) for name in QUERY_NAMES if getattr(self, name) is not None}


def _shown(key: str, value) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return f"{QUERY_NAMES[key]}={text[:60]}"


def choose(
    requested: dict, key: str, allowed: Iterable, default: Any, why: str, shown: str | None = None
) -> tuple[Any, str | None]:
    """``(value, message)``: the link's value for ``key`` when it is one of ``allowed``, else ``default`` and a
    message naming the value, ``why`` (e.g. "is not a checkpoint of this server") and what is shown instead
    (``shown``, when the default's value alone would not say what it means)."""
    if key not in requested:
        return default, None
    value = whole(requested[key])
    if isinstance(value, (str, int)) and not isinstance(value, bool) and value in allowed:
        return value, None
    return default, f"the link's {_shown(key, value)} {why}; showing {shown or repr(default)} instead"


def whole(value: object) -> object:
    """``value`` as an ``int`` when it is a float without a fraction (``-1.0``), else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def choose_index(
    requested: dict, key: str, low: int, high: int, default: Any, shown: str | None = None
) -> tuple[Any, str | None]:
    """``(value, message)``: the link's integer for ``key`` when ``low <= value <= high``, else ``default``
    (called ``shown`` in the message, when its value alone would not say what it means)."""
    if key not in requested:
        return default, None
    value = whole(requested[key])
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value, None
    limits = f"{low}–{high}" if high != low else str(low)
    return (
        default,
        f"the link's {_shown(key, value)} is not an integer in {limits}; showing {shown or repr(default)} instead",
    )
