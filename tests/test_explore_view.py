"""The explorer notebook's view without a browser or a kernel: the choices a model offers and what a selection
shows (``notebooks.explore_view``), as the notebook's widgets would set and show them."""

from pathlib import Path

import pytest

from fca_workbench import condition
from fca_workbench.foundation.errors import UserError
from fca_workbench.notebooks.explore_view import ExploreView
from fca_workbench.notebooks.reproduce import NotebookRun
from fca_workbench.results.conditions import REFERENCE, unregister_condition
from fca_workbench.viewmodel.links import ALL_LAYERS


def view_of(root: Path, checkpoints: list[Path], model: str | None = None) -> ExploreView:
    run = NotebookRun(
        checkpoints=[str(c) for c in checkpoints],
        window=64,
        max_windows=4,
        batch_size=4,
        per_layer=False,
        out=str(root / "out"),
        cache=str(root / "cache"),
        progress=False,
    )
    return ExploreView(run, model)


class StatusLine:
    """What the notebook's status line showed, in order (the ``say`` the view is given)."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def __call__(self, line: str) -> None:
        self.said.append(line)

    @property
    def now(self) -> str:
        return self.said[-1] if self.said else ""


@pytest.fixture
def models(tiny_checkpoints):
    return [tiny_checkpoints[name] for name in ("featuregate", "dense", "muddpythia")]


def test_a_model_opens_with_its_choices_and_shows_two_figures(models, tmp_path):
    view, status = view_of(tmp_path, models), StatusLine()
    assert view.model == "featuregate" and list(view.checkpoints) == ["featuregate", "dense", "muddpythia"]
    choices = view.open("featuregate", None, None, 0, status)
    assert status.said == [view.opening_line("featuregate"), ""]  # the opening line, then nothing
    assert choices.enabled and choices.layer == ALL_LAYERS and choices.condition == "cross_input"
    assert choices.layers == {"all layers": ALL_LAYERS, "layer 0": 0, "layer 1": 1}
    assert choices.last_window == 3 and REFERENCE not in choices.conditions

    shown = view.show(choices.layer, choices.condition, 2)
    heat, line = shown.figures
    assert heat.layout.title.text == "featuregate, all layers: coefficients by position (mean over slots)"
    assert [t.y for t in heat.data] == [("layer 0", "layer 1")] * 2
    assert line.layout.title.text == "featuregate, window 2: ΔNLL of cross_input (all layers) against correct"
    assert len(shown.table) == 63 and shown.message is None
    assert shown.caption == "featuregate, eval window 2; seed 0"
    donor = view.explorer.session.donor_of(2, 0)
    assert shown.notes == [f"donor: eval window {donor} (the audit's derangement, seed 0)"]

    one_layer = view.show(1, "token_shuffle", 2)
    assert one_layer.figures[0].layout.title.text == "featuregate, layer 1: coefficients by position"
    assert "ΔNLL of token_shuffle (layer 1)" in one_layer.figures[1].layout.title.text
    assert one_layer.notes == ["seed 0 (the run's)"]
    assert view.show(1, "layer_mean", 2).notes == []  # a static profile: neither seed nor donor


def test_switching_models_clears_the_opening_line_and_keeps_the_choices_it_can(models, tmp_path):
    view, status = view_of(tmp_path, models), StatusLine()
    view.open("featuregate", None, None, 0, status)
    dense = view.open("dense", 1, "token_shuffle", 3, status)
    assert status.now == "" and status.said.count(view.opening_line("dense")) == 1
    assert not dense.enabled  # a model without a controller: its message instead of figures
    shown = view.show(1, "token_shuffle", 3)
    assert (
        shown.figures == ()
        and shown.message == "**dense**: dense has no controller (dense): no coefficients to explore"
    )

    mudd = view.open("muddpythia", 1, "token_shuffle", 3, status)
    assert status.now == ""
    assert (mudd.enabled, mudd.layer, mudd.condition, mudd.window) == (True, 1, "token_shuffle", 3)
    assert (
        view.show(mudd.layer, mudd.condition, mudd.window)
        .figures[0]
        .layout.title.text.startswith("muddpythia, layer 1")
    )
    kept = view.open("featuregate", 7, "no_such_condition", 99, status)  # what it lacks: the defaults, the last window
    assert (kept.layer, kept.condition, kept.window) == (ALL_LAYERS, "cross_input", 3)


def test_errors_show_in_the_view(models, tmp_path, monkeypatch):
    view, status = view_of(tmp_path, models), StatusLine()
    view.open("featuregate", None, None, 0, status)
    routed = view.show(None, "layer_mean_topk", 0)  # a router's condition on a model without routers
    assert routed.figures == () and "is only for models whose controllers are top-k routers" in routed.message

    def broken(*_):
        raise RuntimeError("boom")

    monkeypatch.setattr(view.explorer, "window_table", broken)
    shown = view.show(None, "cross_input", 0)
    assert shown.message.startswith("**featuregate**: internal error (RuntimeError: boom); the session keeps working")
    assert "Traceback" in shown.message
    monkeypatch.undo()
    assert len(view.show(None, "cross_input", 0).figures) == 2  # the next selection works again

    monkeypatch.setattr(view.run, "explorer", broken)  # a model that fails to open: said, the status line cleared
    assert not view.open("muddpythia", None, None, 0, status).enabled
    assert status.now == "" and "internal error (RuntimeError: boom)" in view.show(None, "cross_input", 0).message


def test_a_model_not_among_the_checkpoints_is_one_line(models, tmp_path):
    with pytest.raises(UserError, match="model 'moe' is not among the checkpoints: featuregate, dense"):
        view_of(tmp_path, models, "moe")


def test_every_condition_the_model_replays_is_offered_registered_ones_too(models, tmp_path):
    @condition("positions_reversed", "the window's own values, positions reversed")
    def positions_reversed(assignment):
        return [{name: t.flip(1) for name, t in value.items()} for value in assignment.own]

    try:
        view = view_of(tmp_path, models)
        choices = view.open("featuregate", None, "positions_reversed", 0, StatusLine())
        assert choices.conditions == [c for c in view.explorer.session.conditions if c != REFERENCE]
        assert choices.conditions[-1] == "positions_reversed" == choices.condition
        shown = view.show(0, "positions_reversed", 1)
        assert "ΔNLL of positions_reversed (layer 0)" in shown.figures[1].layout.title.text
        assert shown.table["delta"].abs().max() > 0
    finally:
        unregister_condition("positions_reversed")
