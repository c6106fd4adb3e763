# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python (fca-workbench)
#     language: python
#     name: fca-workbench
# ---

# %% [markdown]
# # Explore coefficients and assignment dependence
#
# For JupyterLab: choose a model, a layer (or all), a condition and an eval window. The heatmaps show the window's cached coefficients and the ones the condition assigns instead; the line shows the per-token ΔNLL of the frozen replay under that condition against `correct`. A single layer applies the condition at that layer only (the others keep their correct coefficients).
#
# Nothing is audited up front: a model is opened when it is first selected, and only its eval windows' coefficients are captured (a progress bar shows it); the calibration set is captured the first time a static profile is asked for. Captures go to the shared `cache` folder under the same key a full audit uses, so a `fca reproduce` run or an earlier session with the same checkpoint, data and settings is read back instead (point `audits` at a reproduce run's `audits/` folder and set its `max_windows` to list its audits at the end too).

# %% tags=["parameters"]
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
checkpoints = None  # checkpoint folders; None: the shipped featuregate-s0..s6, dense-s0, muddpythia-s0, moe-s0, ssm-s0
eval_data = None  # eval text (.txt, or JSONL of {"text": ...}); None: the shipped eval split
calibration_data = None  # calibration text for the static profiles; None: the shipped calibration split
window = None  # tokens per window; None: min(256, the model's context)
max_windows = 64  # at most this many windows of each set; None: all of them
device = "cpu"  # cpu or cuda
dtype = "float32"  # float32, bfloat16 or float16
seed = 0  # seeds the derangement, the shuffles and the bootstrap
batch_size = None  # windows per batch; None: 16 on CPU, fitted to free memory on CUDA
per_layer = True  # also every condition at each layer alone (audit.json per_layer; 06_per_layer)
out = None  # tables/ and figures/ are written here; None: results/notebooks
audits = None  # audit folders, shared by every notebook; None: <out>/audits
cache = None  # coefficient caches, shared across runs; None: results/cache
model = None  # model to open first (checkpoint folder name); None: the first checkpoint
layer = None  # layer to intervene at; None: all layers
condition = None  # condition to compare with correct; None: cross_input
window_index = 0  # eval window to show

# %%
import ipywidgets as widgets
import plotly.express as px
from IPython.display import Markdown, display

import fca_workbench
from fca_workbench.notebooks import tables
from fca_workbench.notebooks.explore_view import ExploreView
from fca_workbench.notebooks.reproduce import NotebookRun
from fca_workbench.results.conditions import REFERENCE

tables.use_paper_style()  # Okabe-Ito colours on white, for every figure below
run = NotebookRun(
    checkpoints=checkpoints,
    eval_data=eval_data,
    calibration_data=calibration_data,
    window=window,
    max_windows=max_windows,
    device=device,
    dtype=dtype,
    seed=seed,
    batch_size=batch_size,
    per_layer=per_layer,
    out=out,
    audits=audits,
    cache=cache,
)
run.check()
explore = ExploreView(run, model)  # a model is opened when first selected, not before

# %%
wide = {"description_width": "initial"}
model_w = widgets.Dropdown(options=list(explore.checkpoints), value=explore.model, description="model", style=wide)
layer_w = widgets.Dropdown(description="layer", style=wide)
condition_w = widgets.Dropdown(description="condition", style=wide)
window_w = widgets.IntSlider(min=0, description="window", continuous_update=False, style=wide)
notes = widgets.HTML()
view = widgets.Output()
# the status line and the capture's progress bars show in an Output of their own, cleared once the model is open:
# tqdm closes a finished bar's widget, and a closed widget left in ``view`` would break what ``view`` shows next
opening = widgets.Output()
updating = [False]  # while the choices are set from the model's, their changes render nothing


def say(line):
    if line:
        tables.show_text_in(opening, line)
    else:
        tables.show_in(opening)  # cleared


def choose(choices):
    updating[0] = True
    try:
        for w in (layer_w, condition_w, window_w):
            w.disabled = not choices.enabled
        if not choices.enabled:  # a model that cannot be explored: its message shows instead
            return
        layer_w.options, layer_w.value = list(choices.layers.items()), choices.layer
        condition_w.options, condition_w.value = choices.conditions, choices.condition
        window_w.max, window_w.value = choices.last_window, choices.window
    finally:  # a failed update must not leave every later render skipped
        updating[0] = False


# a callback's exception shows in ``view`` (ipywidgets would only log it); ``view`` changes only by setting its
# outputs, never by capturing prints, so no update can arrive after a later one
@tables.errors_shown_in(view)
def render(*_):
    if updating[0]:
        return
    shown = explore.show(layer_w.value, condition_w.value, window_w.value)
    notes.value = "; ".join(shown.notes)
    if shown.figures:
        tables.show_in(view, *shown.figures)
    else:
        tables.show_text_in(view, shown.message or "")


@tables.errors_shown_in(view)
def on_model(*_):
    tables.show_in(view)  # cleared
    with opening:
        choose(explore.open(model_w.value, layer_w.value, condition_w.value, window_w.value, say))
    render()


# the first model opens before the widgets show: its status line and progress bars under the cell
status = display(Markdown(""), display_id=True)
choose(explore.open(explore.model, layer, condition, window_index, lambda line: status.update(Markdown(line))))
model_w.observe(on_model, names="value")
for w in (layer_w, condition_w, window_w):
    w.observe(render, names="value")
display(widgets.VBox([widgets.HBox([model_w, layer_w]), widgets.HBox([condition_w, window_w]), notes, opening, view]))
render()

# %% [markdown]
# The finished audits of these checkpoints and settings as pandas DataFrames, in three lines: load the audit folders (any `fca reproduce` run's `audits/` works), sort, plot. `load_audits(...)` also gives `.retention`, `.variance`, `.execution`, `.per_token` (one row per token and condition); `fca_workbench.load_audit(folder)` opens one audit. The explorer above needs none of them.

# %%
finished = run.finished_audits()
if finished:
    results = fca_workbench.load_audits(finished)
    display(results.conditions.sort_values("delta", ascending=False))
    tables.show(
        px.bar(
            results.conditions,
            x="condition",
            y="delta",
            color="model",
            barmode="group",
            labels={"delta": f"ΔNLL against {REFERENCE} (nats)"},
        )
    )
else:
    display(Markdown(f"No finished audit for these settings in `{run.audits}` yet (`fca reproduce` writes them)."))

# %% [markdown]
# The selection the notebook was run with, written as a table and figures (for papermill runs):

# %%
shown = explore.show(layer_w.value, condition_w.value, window_w.value)
if shown.figures:
    heat, line = shown.figures
    run.write_figure(heat, "explore_coefficients", shown.caption)
    run.write_figure(line, "explore_delta_nll", shown.caption)
    run.write_table(shown.table)
