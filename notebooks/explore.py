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
from pathlib import Path

import ipywidgets as widgets
import plotly.express as px
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

import fca_workbench
from fca_workbench.foundation.errors import UserError
from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun
from fca_workbench.results.conditions import CROSS_INPUT, REFERENCE

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
checkpoints_ = {Path(c).name: c for c in run.checkpoints}  # opened when first selected, not before


# %%
def figures(name, layer, condition, window_):
    e = run.explorer(checkpoints_[name])
    correct, assigned = e.coefficients(REFERENCE, window_), e.coefficients(condition, window_, layer)
    if layer is None:
        z = [tables.layer_position_matrix(c).tolist() for c in (correct, assigned)]
        y = [f"layer {l}" for l in range(e.num_layers)]
    else:
        z = [c[layer].flatten(1).T.tolist() for c in (correct, assigned)]
        y = tables.slot_labels(e.slot_shapes[layer], e.arch, e.routers[layer])
    heat = make_subplots(
        rows=2,
        cols=1,
        vertical_spacing=0.12,
        subplot_titles=[f"{REFERENCE}: window {window_}", f"{condition}: what the replay gets"],
    )
    for row, values in enumerate(z, start=1):
        heat.add_trace(go.Heatmap(z=values, y=y, coloraxis="coloraxis"), row=row, col=1)
    where = "all layers" if layer is None else f"layer {layer}"
    heat.update_layout(
        title=f"{name}, {where}: coefficients by position" + (" (mean over slots)" if layer is None else ""),
        height=520,
        coloraxis={
            "colorscale": "Viridis",
            "colorbar": {"title": "coefficient" + (" (slot mean)" if layer is None else "")},
        },
    )
    heat.update_xaxes(title_text="position")
    heat.update_yaxes(title_text="layer" if layer is None else "slot")
    table = e.window_table(condition, window_, layer)
    line = px.line(
        table,
        x="position",
        y="delta",
        hover_data=["token"],
        markers=True,
        height=320,
        labels={"delta": f"ΔNLL against {REFERENCE} (nats)"},
        title=f"{name}, window {window_}: ΔNLL of {condition} ({where}) against {REFERENCE}",
    )
    return heat, line, table


# %%
first = model or next(iter(checkpoints_))
if first not in checkpoints_:
    raise ValueError(f"model {first!r} is not among the checkpoints: {', '.join(checkpoints_)}")

ALL = "all"  # the layer dropdown's value for every layer at once (a None value would show an empty label)
wide = {"description_width": "initial"}
model_w = widgets.Dropdown(options=list(checkpoints_), value=first, description="model", style=wide)
layer_w = widgets.Dropdown(description="layer", style=wide)
condition_w = widgets.Dropdown(description="condition", style=wide)
window_w = widgets.IntSlider(min=0, description="window", continuous_update=False, style=wide)
view = widgets.Output()
# the capture's progress bars show in an Output of their own, cleared once the model is open: tqdm closes a
# finished bar's widget, and a closed widget left in ``view`` would break what ``view`` shows next
opening = widgets.Output()
note = display(
    Markdown(f"Opening `{first}` (its eval capture, or the one already in `{run.cache}`) ..."), display_id=True
)
run.explorer(checkpoints_[first])
note.update(Markdown(""))  # gone once open: the model shown is the dropdown's
selection = {"explorer": None, "updating": False}


def configure(e, layer_, condition_, window_):
    """Point the layer, condition and window widgets at explorer ``e`` (None: a model that cannot be explored),
    keeping the given selection where ``e`` has it."""
    selection.update(explorer=e, updating=True)
    try:
        for w in (layer_w, condition_w, window_w):
            w.disabled = e is None
        if e is not None:
            layer_w.options = [(ALL, ALL)] + [(str(l), l) for l in range(e.num_layers)]
            layer_w.value = layer_ if layer_ in range(e.num_layers) else ALL
            condition_w.options = [c for c in e.conditions if c != REFERENCE]  # routers add layer_mean_topk
            condition_w.value = condition_ if condition_ in condition_w.options else CROSS_INPUT
            window_w.max = len(e.windows) - 1
            window_w.value = min(window_, window_w.max)
    finally:  # a failed update must not leave every later render skipped
        selection["updating"] = False


# a callback's exception shows in ``view`` (ipywidgets would only log it); ``view`` changes only by setting its
# outputs, never by capturing prints, so no update can arrive after a later one
@tables.errors_shown_in(view)
def render(*_):
    if selection["updating"] or selection["explorer"] is None:
        return
    layer_ = None if layer_w.value == ALL else layer_w.value
    heat, line, _ = figures(model_w.value, layer_, condition_w.value, window_w.value)
    tables.show_in(view, heat, line)


@tables.errors_shown_in(view)
def on_model(*_):
    tables.show_in(view)  # cleared
    with opening:
        display(Markdown(f"Opening `{model_w.value}` ..."))
        try:
            e = run.explorer(checkpoints_[model_w.value])
        except UserError as exc:  # e.g. a Dense model: no controller, no coefficients
            e = None
            tables.show_text_in(view, f"**{model_w.value}**: {exc}")
    opening.clear_output()
    configure(e, layer_w.value, condition_w.value, window_w.value)
    render()


configure(run.explorer(checkpoints_[first]), layer, condition, window_index)
model_w.observe(on_model, names="value")
for w in (layer_w, condition_w, window_w):
    w.observe(render, names="value")
display(widgets.VBox([widgets.HBox([model_w, layer_w]), widgets.HBox([condition_w, window_w]), opening, view]))
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
heat, line, table = figures(
    model_w.value, None if layer_w.value == ALL else layer_w.value, condition_w.value, window_w.value
)
caption = f"{model_w.value}, eval window {window_w.value}; seed {seed}"
run.write_figure(heat, "explore_coefficients", caption)
run.write_figure(line, "explore_delta_nll", caption)
run.write_table(table)
