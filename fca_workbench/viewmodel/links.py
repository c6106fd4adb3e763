"""The live view's selection, fitted to what a checkpoint can show: the choices it offers, a link's values
applied to them (each checked, a value that does not fit leaves the default and a note), and the link of the
view shown (``query.ViewQuery``'s values).

The app reads its widgets into a ``Selection``, sets them from ``fitted`` and ``linked``, and writes
``link_of`` into the URL; nothing here knows a widget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import TOKEN_SHUFFLE, condition_named
from fca_workbench.viewmodel.inputs import TextInput, pasted_input, window_input
from fca_workbench.viewmodel.live import SharedModel
from fca_workbench.viewmodel.query import (
    ALL_LAYERS,
    ALL_LAYERS_LABEL,
    ALL_LAYERS_LINK,
    AUDIT_DONOR,
    AUDIT_DONOR_LINK,
    SOURCES,
    VIEWS,
    choose,
    choose_index,
    whole,
)

MAX_SEED = 2**31 - 1
DEFAULT_CONDITION = TOKEN_SHUFFLE  # what the live view shows first, and wherever a checkpoint lacks the one chosen
WINDOW_SOURCE, TEXT_SOURCE = SOURCES  # the two text sources, as the choice shows them


@dataclass(frozen=True)
class Selection:
    """The live view's choices as the widgets hold them: ``source`` a label of ``SOURCES``, ``layer`` where the
    intervention goes (a decoder layer, a controller's module path, or ``ALL_LAYERS``), ``donor`` an eval window or ``AUDIT_DONOR``; ``seed`` None while its box is empty."""

    checkpoint: str
    source: str = WINDOW_SOURCE
    window: int | None = 0
    text: str | None = ""  # the pasted text (checked by ``live.pasted_input``)
    condition: str = DEFAULT_CONDITION
    layer: int | str | None = ALL_LAYERS
    seed: int | None = 0
    donor: int | None = AUDIT_DONOR

    @property
    def replay_layer(self) -> int | str | None:
        return replay_layer(self.layer)

    @property
    def chosen_donor(self) -> int | None:
        """cross_input's donor window (None: the audit's seeded derangement)."""
        return None if self.donor is None or self.donor < 0 else int(self.donor)

    def text_input(self, model: SharedModel) -> TextInput:
        """The tokens this selection runs on: the pasted text or the eval window."""
        if self.source == TEXT_SOURCE:
            return pasted_input(model, self.text)
        return window_input(model, self.window)

    def checked_seed(self) -> int:
        if self.seed is None:
            raise UserError("seed is empty: enter a non-negative integer")
        return int(self.seed)


def replay_layer(layer: int | str | None) -> int | str | None:
    """Where an intervention goes from the layer choice: a decoder layer, a controller's module path, or None
    (every layer)."""
    return None if layer in (None, ALL_LAYERS) else layer


def layer_options(choices: dict[str, int | str]) -> dict[str, int | str]:
    """The layer choice: every layer at once, one decoder layer (its controllers together) or one controller
    alone where a layer holds several (``choices``: ``adapters.sites.site_choices``)."""
    return {ALL_LAYERS_LABEL: ALL_LAYERS, **choices}


def fitted_layer(layer: int | str | None, choices: dict[str, int | str]) -> int | str:
    """The layer choice kept when the model offers it, else every layer (``ALL_LAYERS``)."""
    return layer if layer is not None and layer in choices.values() else ALL_LAYERS


def fitted_condition(condition: str | None, offered: Sequence[str], default: str = DEFAULT_CONDITION) -> str:
    """The condition choice kept when ``offered`` has it (a checkpoint's conditions, the registry's registered
    ones among them), else ``default``."""
    return condition if condition is not None and condition in offered else default


def heat_layer_options(labels: Sequence[str]) -> dict[str, int]:
    """The slot heatmap's choice of one controller, by its label (``adapters.sites.controller_labels``)."""
    return {label: i for i, label in enumerate(labels)}


def heat_controller(model: SharedModel, layer: int | str) -> int | None:
    """The controller the slot heatmap shows for a layer choice: the first of the layer's, or the one chosen
    alone; None where the model has no such choice."""
    try:
        controllers = model.controllers_at(layer)
    except UserError:
        return None
    return None if not controllers else controllers[0]


def slot_options(model: SharedModel) -> list[str]:
    """The heatmap's slot choice (none for a model without a controller)."""
    return model.all_slot_labels() if model.has_coefficients else []


@dataclass(frozen=True)
class Fitted:
    """What the live view's choices offer for one checkpoint, with the current values fitted to them."""

    layers: dict[str, int | str]
    layer: int | str
    heat_layers: dict[str, int]
    heat_layer: int
    slots: list[str]
    slot: str | None
    last_window: int
    window_label: str
    window_disabled: bool
    conditions: list[str]
    condition: str
    seed_disabled: bool
    donor_disabled: bool
    condition_help: str


def fitted(
    model: SharedModel,
    layer: int | str | None,
    heat_layer: int | None,
    slot: str | None,
    condition: str,
    source: str,
) -> Fitted:
    """The choices ``model`` offers; a current value it cannot show becomes the default (all layers, the nearest
    layer, the first slot, ``DEFAULT_CONDITION``)."""
    layers, heat_layers, slots = (
        layer_options(model.site_choices),
        heat_layer_options(model.controller_labels),
        slot_options(model),
    )
    conditions = list(model.conditions)  # routers add layer_mean_topk
    condition = fitted_condition(condition, conditions)
    last = len(model.eval_windows) - 1
    return Fitted(
        layers=layers,
        layer=fitted_layer(layer, model.site_choices),
        heat_layers=heat_layers,
        heat_layer=min(max(heat_layer or 0, 0), max(len(heat_layers) - 1, 0)),
        slots=slots,
        slot=slot if slot in slots else (slots[0] if slots else None),
        last_window=last,
        window_label=f"Eval window (0–{last}, {model.window} tokens each)",
        window_disabled=source != WINDOW_SOURCE,
        conditions=conditions,
        condition=condition,
        seed_disabled=not condition_named(condition).seeded,
        donor_disabled=not condition_named(condition).needs_donor,
        condition_help=condition_named(condition).help,
    )


def opening_view(requested: dict) -> tuple[str, str | None]:
    """``(view, note)``: the tab a link opens (``VIEWS``)."""
    return choose(requested, "view", VIEWS, VIEWS[0], f"is not a view ({', '.join(VIEWS)})")


def opening_checkpoint(requested: dict, names: Sequence[str], default: str) -> tuple[str, str | None]:
    """``(checkpoint, note)``: the checkpoint a link opens, one of the server's ``names``."""
    return choose(requested, "checkpoint", names, default, "is not a checkpoint of this server")


def linked(requested: dict, model: SharedModel, slots: Sequence[str], condition: str) -> tuple[dict, list[str]]:
    """The link's live-view values checked against ``model`` (``slots``: those the heatmap offers), in the order
    to set them: ``({choice: value}, notes)``; a value that does not fit gives the default and a note.
    ``condition``: the one shown now, kept when the link names none this checkpoint has."""
    last_window, last_controller = len(model.eval_windows) - 1, max(len(model.controller_labels) - 1, 0)
    source, note = choose(
        requested,
        "source",
        SOURCES.values(),
        SOURCES[WINDOW_SOURCE],
        f"is not a text source ({', '.join(SOURCES.values())})",
    )
    if source == SOURCES[TEXT_SOURCE]:
        note = "the link was to pasted text, which a link does not carry; showing an eval window instead"
    notes = [note] if note else []
    for key, word in (("layer", ALL_LAYERS_LINK), ("donor", AUDIT_DONOR_LINK)):  # the defaults, as a link spells them
        if requested.get(key) == word:
            requested = {k: v for k, v in requested.items() if k != key}
    chosen = {
        "window": choose_index(requested, "window", 0, last_window, 0),
        "layer": choose(
            requested,
            "layer",
            model.site_choices.values(),
            ALL_LAYERS,
            "is neither a decoder layer with a controller nor a controller's module path",
            ALL_LAYERS_LABEL,
        ),
        "condition": choose(
            requested, "condition", model.conditions, condition, "is not an intervention of this checkpoint"
        ),
        "seed": choose_index(requested, "seed", 0, MAX_SEED, 0),
        "donor": choose_index(requested, "donor", AUDIT_DONOR, last_window, AUDIT_DONOR, "the audit's donor"),
        "heat_layer": choose_index(requested, "heat_layer", 0, last_controller, 0),
    }
    if slots:
        chosen["heat_slot"] = choose(requested, "heat_slot", slots, slots[0], "is not a slot of this checkpoint")
    notes += [note for _, note in chosen.values() if note]
    return {name: value for name, (value, _) in chosen.items()}, notes


def link_of(view: str, selection: Selection, heat_slot: str | None, heat_layer: int | None, audit: str | None) -> dict:
    """The values of ``query.ViewQuery`` (the URL) for the view shown: a whole number as an integer, the
    audit's donor as ``AUDIT_DONOR_LINK`` (no negative number, which Panel would read back as a float)."""
    return dict(
        view=view,
        checkpoint=selection.checkpoint,
        source=SOURCES[selection.source],
        window=whole(selection.window),
        layer=ALL_LAYERS_LINK if selection.replay_layer is None else whole(selection.replay_layer),
        condition=selection.condition,
        seed=whole(selection.seed),
        donor=AUDIT_DONOR_LINK if selection.donor == AUDIT_DONOR else whole(selection.donor),
        heat_slot=heat_slot,
        heat_layer=whole(heat_layer),
        audit=audit,
    )
