"""The explorer notebook's view (``notebooks/explore.py``) without widgets: what its choices offer for the model
open, and what it shows for a selection (two figures and the per-token table, or one message).

The notebook passes its widgets' values in, sets them from ``Choices`` and shows a ``Shown``;
nothing here knows a widget. The layer and condition are fitted to a model as the dashboard's live view fits
them (``viewmodel.links``), an error is worded as the dashboard words it (``errors.internal_error``),
and each checkpoint is opened once (``NotebookRun.explorer``).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import plotly.express as px
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from fca_workbench.adapters.sites import Choice, choice_name
from fca_workbench.explore import Explorer
from fca_workbench.foundation.checkpoint import checkpoint_name
from fca_workbench.foundation.errors import UserError, internal_error
from fca_workbench.notebooks.notebook_run import NotebookRun
from fca_workbench.results.conditions import CROSS_INPUT, REFERENCE, condition_named
from fca_workbench.results.figures import layer_position_matrix
from fca_workbench.results.slots import slot_labels
from fca_workbench.viewmodel.links import ALL_LAYERS, fitted_condition, fitted_layer, layer_options, replay_layer

if TYPE_CHECKING:
    import pandas as pd

DEFAULT_CONDITION = CROSS_INPUT  # what the explorer compares with ``REFERENCE`` first


@dataclass(frozen=True)
class Choices:
    """What the layer, condition and window choices offer for the model open, the current values fitted to them;
    ``enabled`` False for a model that cannot be explored (its message is what the view shows)."""

    layers: dict[str, int | str]  # where to intervene: every layer, a decoder layer, one controller alone
    layer: int | str
    conditions: list[str]
    condition: str
    last_window: int
    window: int
    enabled: bool


NO_CHOICES = Choices({}, ALL_LAYERS, [], DEFAULT_CONDITION, 0, 0, enabled=False)


@dataclass(frozen=True)
class Shown:
    """What the view shows: the coefficient heatmaps and the ΔNLL line, or a Markdown message instead."""

    figures: tuple[go.Figure, ...] = ()
    table: pd.DataFrame | None = None
    message: str | None = None
    caption: str = ""  # what the figures were drawn from, for the files a run writes
    notes: list[str] = field(default_factory=list)  # the seed and donor the condition used


def offered_conditions(explorer: Explorer) -> list[str]:
    """Every condition the model replays, the registry's registered ones included, but ``REFERENCE``: each is
    compared with it."""
    return [c for c in explorer.conditions if c != REFERENCE]


class ExploreView:
    """The explorer's state in one notebook: the model open (None when it cannot be explored, with ``message``
    saying why) and what a selection of it shows."""

    def __init__(self, run: NotebookRun, model: str | None = None) -> None:
        self.run = run
        self.checkpoints = {checkpoint_name(c): c for c in run.checkpoints}
        self.model = model or next(iter(self.checkpoints))
        if self.model not in self.checkpoints:
            raise UserError(f"model {self.model!r} is not among the checkpoints: {', '.join(self.checkpoints)}")
        self.explorer: Explorer | None = None
        self.message: str | None = None

    def opening_line(self, name: str) -> str:
        return f"Opening `{name}` (its eval capture, or the one already in `{self.run.cache}`) ..."

    def open(self, name: str, layer: Choice, condition: str | None, window: int, say: Callable[[str], None]) -> Choices:
        """Open checkpoint ``name`` (its eval capture, once per run) and fit the choices to it. ``say`` shows the
        status line: the opening line while it opens, then nothing, whether it opened or failed."""
        self.model = name
        say(self.opening_line(name))
        try:
            self.explorer, self.message = self.run.explorer(self.checkpoints[name]), None
        except Exception as exc:  # e.g. a Dense model: no controller, no coefficients; shown, not raised
            self.explorer, self.message = None, f"**{name}**: {described(exc)}"
        finally:
            say("")
        return self.choices(layer, condition, window)

    def choices(self, layer: Choice, condition: str | None, window: int) -> Choices:
        """The model's choices with ``layer`` (a decoder layer, a controller's module path), ``condition`` and
        ``window`` kept where it has them, else all layers, ``DEFAULT_CONDITION`` and its last window."""
        e = self.explorer
        if e is None:
            return NO_CHOICES
        conditions = offered_conditions(e)
        last = len(e.windows) - 1
        return Choices(
            layers=layer_options(e.choices),
            layer=fitted_layer(layer, e.choices),
            conditions=conditions,
            condition=fitted_condition(condition, conditions, DEFAULT_CONDITION),
            last_window=last,
            window=min(max(window, 0), last),
            enabled=True,
        )

    def show(self, layer: Choice, condition: str, window: int) -> Shown:
        """What the view shows for the model open; an error is its message, never raised."""
        if self.explorer is None:
            return Shown(message=self.message)
        try:
            return self._shown(self.explorer, replay_layer(layer), condition, window)
        except Exception as exc:  # the view says what went wrong, and the next choice works again
            return Shown(message=f"**{self.model}**: {described(exc)}")

    def _shown(self, e: Explorer, layer: Choice, condition: str, window: int) -> Shown:
        where = choice_name(layer)
        correct, assigned = e.coefficients(REFERENCE, window), e.coefficients(condition, window, layer)
        heat = coefficient_heatmaps(e, correct, assigned, e.controllers_at(layer), condition, window)
        heat.update_layout(
            title=f"{self.model}, {where}: coefficients by position" + (" (mean over slots)" if layer is None else "")
        )
        table = e.window_table(condition, window, layer)
        line = px.line(
            table,
            x="position",
            y="delta",
            hover_data=["token"],
            markers=True,
            height=320,
            labels={"delta": f"ΔNLL against {REFERENCE} (nats)"},
            title=f"{self.model}, window {window}: ΔNLL of {condition} ({where}) against {REFERENCE}",
        )
        caption = f"{self.model}, eval window {window}; seed {e.settings.seed}"
        return Shown((heat, line), table, caption=caption, notes=condition_notes(e, condition, window))


def coefficient_heatmaps(
    e: Explorer, correct: list, assigned: list, controllers: list[int] | None, condition: str, window: int
) -> go.Figure:
    """The window's own coefficients over the ones ``condition`` assigns: controller by position (each one's slot
    mean; ``layer L``, or its module path in a layer of several), or the chosen controllers' slots by position (a
    slot named with its controller where a layer holds several); one colour scale, so the two read alike."""
    if controllers is None:
        z = [layer_position_matrix(c).tolist() for c in (correct, assigned)]
        y = e.controller_labels
    else:
        z = [torch.cat([c[i].flatten(1) for i in controllers], dim=1).T.tolist() for c in (correct, assigned)]
        y = [
            label if len(controllers) == 1 else f"{e.model.controller_names[i]}: {label}"
            for i in controllers
            for label in slot_labels(e.slot_shapes[i], e.arch, e.routers[i])
        ]
    heat = make_subplots(
        rows=2,
        cols=1,
        vertical_spacing=0.12,
        subplot_titles=[f"{REFERENCE}: window {window}", f"{condition}: what the replay gets"],
    )
    for row, values in enumerate(z, start=1):
        heat.add_trace(go.Heatmap(z=values, y=y, coloraxis="coloraxis"), row=row, col=1)
    heat.update_layout(
        height=520,
        coloraxis={
            "colorscale": "Viridis",
            "colorbar": {"title": "coefficient" + (" (slot mean)" if controllers is None else "")},
        },
    )
    heat.update_xaxes(title_text="position")
    heat.update_yaxes(title_text="controller" if controllers is None else "slot")
    return heat


def condition_notes(e: Explorer, condition: str, window: int) -> list[str]:
    """The seed a seeded condition drew with, and the donor window a donor's condition took (the audit's own
    seeded derangement), as the dashboard enables its seed and donor choices."""
    named, seed = condition_named(condition), e.settings.seed
    notes = [f"seed {seed} (the run's)"] if named.seeded and not named.needs_donor else []
    if named.needs_donor:
        notes.append(f"donor: eval window {e.session.donor_of(window, seed)} (the audit's derangement, seed {seed})")
    return notes


def described(exc: Exception) -> str:
    """An error as the view shows it: a ``UserError``'s line, anything else the dashboard's internal-error line
    and its traceback."""
    if isinstance(exc, UserError):
        return str(exc)
    trace = "".join(traceback.format_exception(exc))
    return f"{internal_error(exc)}\n\n```\n{trace}```"
