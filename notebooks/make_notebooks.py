"""Write the workbench notebooks (stripped: no outputs, no execution counts) from the cell sources below.

    .venv/bin/python notebooks/make_notebooks.py

The .ipynb files are committed and can be edited in JupyterLab directly; rerunning this script rewrites
them from here. Every notebook has one cell tagged ``parameters`` (papermill injects its overrides after
it) and holds presentation only: audits, tables' numbers and coefficients all come from ``fca_workbench``.
"""

import json
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from fca_workbench.notebooks.reproduce import DEFAULT_MAX_WINDOWS, KERNEL_NAME

HERE = Path(__file__).resolve().parent

PARAMETERS = f"""\
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
checkpoints = None       # checkpoint folders; None: the shipped featuregate-s0..s6, dense-s0, muddpythia-s0, moe-s0, ssm-s0
eval_data = None         # eval text (.txt, or JSONL of {{"text": ...}}); None: the shipped eval split
calibration_data = None  # calibration text for the static profiles; None: the shipped calibration split
window = None            # tokens per window; None: min(256, the model's context)
max_windows = {DEFAULT_MAX_WINDOWS}         # at most this many windows of each set; None: all of them
device = "cpu"           # cpu or cuda
dtype = "float32"        # float32, bfloat16 or float16
seed = 0                 # seeds the derangement, the shuffles and the bootstrap
batch_size = None        # windows per batch; None: 16 on CPU, fitted to free memory on CUDA
per_layer = True         # also every condition at each layer alone (audit.json per_layer; 06_per_layer)
out = None               # tables/ and figures/ are written here; None: results/notebooks
audits = None            # audit folders, shared by every notebook; None: <out>/audits
cache = None             # coefficient caches, shared across runs; None: results/cache"""

SETUP = """\
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun

run = NotebookRun(checkpoints=checkpoints, eval_data=eval_data, calibration_data=calibration_data, window=window,
                  max_windows=max_windows, device=device, dtype=dtype, seed=seed, batch_size=batch_size,
                  per_layer=per_layer, out=out, audits=audits, cache=cache)
audited = run.load_audits()  # run_audit per checkpoint, or the audit.json already there for these settings
display(Markdown("Models: " + ", ".join(f"`{tables.model_name(a)}` ({a['model']['arch']})" for a in audited)))"""


def notebook(
    stem: str, title: str, intro: str, cells: list, parameters: str = PARAMETERS, setup: str = SETUP
) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata = {
        "kernelspec": {"name": KERNEL_NAME, "display_name": "Python (fca-workbench)", "language": "python"},
        "language_info": {"name": "python"},
    }
    sources = [("md", f"# {title}\n\n{intro}"), ("parameters", parameters), ("code", setup), *cells]
    for i, (kind, source) in enumerate(sources):
        if kind == "md":
            cell = new_markdown_cell(source)
        else:
            cell = new_code_cell(source)
            if kind == "parameters":
                cell.metadata["tags"] = ["parameters"]
        cell.id = f"{stem.replace('_', '-')}-{i:02d}"
        nb.cells.append(cell)
    return nb


VARIATION = notebook(
    "01_variation",
    "Coefficient variation and variance decomposition",
    "Do the controller's coefficients vary across tokens and inputs, and how much of their variance is static "
    "structure? R² of layer identity, of layer×slot, then adding position or the input window "
    "(`audit.json` → `variance`, `variation`); per model and as mean ± sd over seeds. Heatmaps: each "
    "coefficient's mean over the eval windows (layer × position, and slot × position per layer); a router's "
    "coefficient is its dense gate over the experts (slot = expert).",
    [
        ("code", "run.write_table(tables.variation_table(audited))"),
        ("code", "run.write_table(tables.variation_seed_table(audited))"),
        ("md", "## Variance decomposition"),
        (
            "code",
            """\
r2 = {c.key: c.header for c in tables.VARIANCE_COLUMNS[:4]}
shares = tables.variation_table(audited).melt(id_vars="model", value_vars=list(r2), var_name="figure", value_name="share")
fig = px.bar(shares.replace({"figure": r2}), x="model", y="share", color="figure", barmode="group",
             title="Share of coefficient variance explained", range_y=[0, 1])
fig.update_layout(yaxis_tickformat=".0%")
run.write_figure(fig, "variance_decomposition")
tables.show(fig)""",
        ),
        ("md", "## Coefficient heatmaps (mean over eval windows)"),
        (
            "code",
            """\
def heatmaps(audit):
    cache_ = tables.open_cache(tables.cache_folder(audit, run.audit_dir(audit)))
    means = tables.position_means(cache_)  # per layer [T, *slot], from the audit's own coefficient cache
    rows = len(means) + 1
    fig = make_subplots(rows=rows, cols=1, vertical_spacing=75 / (220 * rows),
                        subplot_titles=["layer × position (mean over slots)"]
                        + [f"layer {l}: slot × position" for l in range(len(means))])
    fig.add_trace(go.Heatmap(z=tables.layer_position_matrix(means).tolist(),
                             y=[f"layer {l}" for l in range(len(means))], coloraxis="coloraxis"), row=1, col=1)
    routers = tables.routers(audit) or [False] * len(means)
    for l, m in enumerate(means):
        labels = tables.slot_labels(cache_.manifest["slot_shapes"][l], audit["model"]["arch"], routers[l])
        fig.add_trace(go.Heatmap(z=m.flatten(1).T.tolist(), y=labels, coloraxis="coloraxis"), row=l + 2, col=1)
    fig.update_layout(title=f"{tables.model_name(audit)}: mean coefficient by position", height=220 * rows,
                      coloraxis={"colorscale": "Viridis"})
    fig.update_xaxes(title_text="position", row=rows, col=1)
    return fig


for audit in tables.with_controller(audited):
    fig = heatmaps(audit)
    run.write_figure(fig, f"heatmap_{tables.model_name(audit)}")
    tables.show(fig)""",
        ),
    ],
)

ASSIGNMENT = notebook(
    "02_assignment",
    "Assignment dependence: NLL and ΔNLL under every condition",
    "Does the frozen model care which coefficients go to which input? Mean next-token NLL (nats) of the frozen "
    "replay under each condition, and ΔNLL against `correct`, with 95% bootstrap CIs over windows "
    "(`audit.json` → `conditions`); per model, then mean ± sd over seeds. For routers, `layer_mean_topk` is the "
    "static sparse model: each layer's k experts with the largest mean gate, for every token.",
    [
        ("code", "run.write_table(tables.assignment_table(audited))"),
        ("code", "run.write_table(tables.assignment_seed_table(audited))"),
        ("md", "## ΔNLL with 95% CIs"),
        (
            "code",
            """\
table = tables.assignment_table(audited).query("condition != 'correct'")
fig = px.scatter(table, x="condition", y="delta", color="model", error_y=table.delta_ci95_hi - table.delta,
                 error_y_minus=table.delta - table.delta_ci95_lo, title="ΔNLL against correct (95% CI)",
                 labels={"delta": "ΔNLL (nats)"})
fig.update_layout(scattermode="group")
run.write_figure(fig, "assignment_delta_nll")
tables.show(fig)""",
        ),
    ],
)

RETENTION = notebook(
    "03_static_profiles",
    "Static profiles: gap retention",
    "How much of the Correct-to-GlobalMean NLL gap does a static profile estimated on the calibration set "
    "retain? `(NLL_global_mean − NLL_P) / (NLL_global_mean − NLL_correct)` for the layerwise profile "
    "(`layer_mean`), one scalar per layer (`layer_scalar`) and per layer and position (`layer_position_mean`) "
    "(`audit.json` → `retention`). The paper reports 98.70% (seven 76M FeatureGate seeds) and 99.43% (three "
    "504M ones) for `layer_mean`, as mean ± sd over seeds: the second table.",
    [
        ("code", "run.write_table(tables.retention_table(audited))"),
        ("code", "main = tables.retention_seed_table(audited)\nrun.write_table(main)"),
        (
            "code",
            """\
bars = pd.concat([main.assign(profile=p, mean=main[f"{p}_mean"], sd=main[f"{p}_sd"]) for p in tables.RETENTION_PROFILES])
bars["arch"] = bars["arch"] + " (n=" + bars["n"].astype(str) + ")"
fig = px.bar(bars, x="profile", y="mean", error_y="sd", color="arch", barmode="group",
             title="Gap retention of static profiles (mean ± sd over seeds)")
fig.update_layout(yaxis_tickformat=".1%")
run.write_figure(fig, "retention")
tables.show(fig)""",
        ),
    ],
)

EXECUTION = notebook(
    "04_execution",
    "Conditional execution",
    "Does the model skip computation because of its coefficients, and is it faster than its baseline? "
    "Blocks executed / present, controller calls, FLOPs of one batch and median latency against the baseline "
    "(`audit.json` → `execution`): a shape-matched Dense, or for a mixture of experts the static mixture that "
    "runs every expert for every token. The MoE row is where conditional execution is real: its routers run "
    "k of E experts per token (`expert_fraction_executed`). The positive control is a copy of each FeatureGate that "
    "really skips the MLP rows whose gates all fall below the calibration median (`execution.positive_control`): "
    "its fraction executed must fall below 1, which shows the audit can see a saving where one exists.",
    [
        ("code", "run.write_table(tables.execution_table(audited))"),
        ("md", "The positive control of each FeatureGate (`audit.json` → `execution.positive_control`):"),
        ("code", "run.write_table(tables.positive_control_table(audited))"),
        ("code", "run.write_table(tables.execution_seed_table(audited))"),
        (
            "code",
            """\
figures = {"fraction_executed": "fraction of branch work executed",
           "expert_fraction_executed": "fraction of expert evaluations run", "latency_ratio_vs_dense": "latency / baseline"}
runs = pd.concat([tables.execution_table(audited).assign(run="model"),
                  tables.positive_control_table(audited).assign(run="positive control")])
bars = runs.melt(id_vars=["model", "run"], value_vars=list(figures), var_name="figure").replace({"figure": figures})
fig = px.bar(bars, x="model", y="value", color="run", facet_col="figure", barmode="group", title="Conditional execution")
fig.update_yaxes(matches=None, showticklabels=True)
run.write_figure(fig, "execution")
tables.show(fig)""",
        ),
    ],
)

MUDD = notebook(
    "05_muddpythia",
    "MUDDPythia: cross-input and token-shuffle penalties",
    "The MUDDPythia table for the checkpoints given (default: the shipped MUDDPythia-tiny; any official "
    "MUDDPythia folder works): NLL and ΔNLL against `correct` when each window gets another window's complete "
    "coefficients (`cross_input`) or its positions are shuffled (`token_shuffle`), with the static profiles "
    "for comparison (`audit.json` → `conditions`). For reference, the paper reports +1.9067 (cross-input) and "
    "+2.9637 (shuffle) nats for MUDDPythia-1.4B.",
    [
        (
            "code",
            """\
mudds = [a for a in audited if a["model"]["arch"] == "muddpythia"]
if not mudds:
    raise ValueError("no MUDDPythia checkpoint among the checkpoints given: " + ", ".join(run.checkpoints))
run.write_table(tables.mudd_table(mudds))""",
        ),
        (
            "code",
            """\
for audit in mudds:
    c = audit["conditions"]
    display(Markdown(
        f"**{tables.model_name(audit)}**: cross-input reassignment {c['cross_input']['delta']:+.4f} nats "
        f"[{c['cross_input']['delta_ci95'][0]:+.4f}, {c['cross_input']['delta_ci95'][1]:+.4f}], token shuffling "
        f"{c['token_shuffle']['delta']:+.4f} [{c['token_shuffle']['delta_ci95'][0]:+.4f}, "
        f"{c['token_shuffle']['delta_ci95'][1]:+.4f}]. {audit['verdict']['conditional_execution']}"))""",
        ),
        (
            "code",
            """\
table = tables.mudd_table(mudds).query("condition != 'correct'")
fig = px.bar(table, x="condition", y="delta", color="model", barmode="group", error_y=table.delta_ci95_hi - table.delta,
             error_y_minus=table.delta - table.delta_ci95_lo, title="MUDDPythia: ΔNLL against correct (95% CI)",
             labels={"delta": "ΔNLL (nats)"})
run.write_figure(fig, "muddpythia_penalties")
tables.show(fig)""",
        ),
    ],
    parameters=PARAMETERS.replace(
        "None: the shipped featuregate-s0..s6, dense-s0, muddpythia-s0, moe-s0, ssm-s0",
        "None: the shipped muddpythia-s0",
    ),
    setup=SETUP.replace(
        "from fca_workbench.notebooks.reproduce import NotebookRun",
        "from fca_workbench.notebooks.reproduce import NotebookRun, shipped_checkpoints",
    ).replace(
        "run = NotebookRun(", 'checkpoints = checkpoints or shipped_checkpoints(["muddpythia-s0"])\nrun = NotebookRun('
    ),
)

PER_LAYER = notebook(
    "06_per_layer",
    "Per layer: which layer's assignment carries the dependence",
    "Each condition applied at one layer alone, every other layer keeping its correct coefficients "
    "(`audit.json` → `per_layer`, audits run with `per_layer = True`; each replay resumes from the kept state "
    "before its layer). ΔNLL against `correct` with 95% bootstrap CIs over windows per model, then mean ± sd "
    "over seeds; the heatmap shows the seed mean per architecture, layer × condition.",
    [
        (
            "code",
            """\
swept = [a for a in audited if a.get("per_layer")]
if not swept:
    raise ValueError("no audit with a per-layer sweep among the checkpoints given (run with per_layer = True)")
for audit in swept:
    display(Markdown(f"**{tables.model_name(audit)}** (sweep: {audit['settings']['per_layer_mode']}): "
                     f"{audit['verdict']['assignment_dependence']}"))""",
        ),
        ("code", "run.write_table(tables.per_layer_table(swept))"),
        ("code", "seeds = tables.per_layer_seed_table(swept)\nrun.write_table(seeds)"),
        ("md", "## ΔNLL by layer and condition (mean over seeds)"),
        (
            "code",
            """\
archs = list(dict.fromkeys(seeds["arch"]))
fig = make_subplots(rows=len(archs), cols=1, subplot_titles=archs, vertical_spacing=0.25 / len(archs))
for i, arch in enumerate(archs, start=1):
    grid = seeds[seeds["arch"] == arch].pivot(index="layer", columns="condition", values="delta_mean")
    fig.add_trace(go.Heatmap(z=grid.to_numpy(), x=list(grid.columns), y=[f"layer {l}" for l in grid.index],
                             coloraxis="coloraxis",
                             hovertemplate="%{y}, %{x}: ΔNLL %{z:+.4f}<extra></extra>"), row=i, col=1)
fig.update_layout(title="ΔNLL vs correct, one condition at one layer alone (mean over seeds)",
                  height=320 * len(archs), coloraxis={"colorscale": "Viridis", "colorbar": {"title": "ΔNLL"}})
run.write_figure(fig, "per_layer_heatmap")
tables.show(fig)""",
        ),
    ],
)

EXPLORE = notebook(
    "explore",
    "Explore coefficients and assignment dependence",
    "For JupyterLab: choose a model, a layer (or all), a condition and an eval window. The heatmaps show the "
    "window's cached coefficients and the ones the condition assigns instead; the line shows the per-token "
    "ΔNLL of the frozen replay under that condition against `correct`. A single layer applies the condition "
    "at that layer only (the others keep their correct coefficients).\n\n"
    "Nothing is audited up front: a model is opened when it is first selected, and only its eval windows' "
    "coefficients are captured (a progress bar shows it); the calibration set is captured the first time a "
    "static profile is asked for. Captures go to the shared `cache` folder under the same key a full audit uses, "
    "so a `fca reproduce` run or an earlier session with the same checkpoint, data and settings is read back "
    "instead (point `audits` at a reproduce run's `audits/` folder and set its `max_windows` to list its audits "
    "at the end too).",
    [
        (
            "code",
            """\
def figures(name, layer, condition, window_):
    e = run.explorer(checkpoints_[name])
    correct, assigned = e.coefficients("correct", window_), e.coefficients(condition, window_, layer)
    if layer is None:
        z = [tables.layer_position_matrix(c).tolist() for c in (correct, assigned)]
        y = [f"layer {l}" for l in range(e.num_layers)]
    else:
        z = [c[layer].flatten(1).T.tolist() for c in (correct, assigned)]
        y = tables.slot_labels(e.slot_shapes[layer], e.arch, e.routers[layer])
    heat = make_subplots(rows=2, cols=1, vertical_spacing=0.12,
                         subplot_titles=[f"correct: window {window_}", f"{condition}: what the replay gets"])
    for row, values in enumerate(z, start=1):
        heat.add_trace(go.Heatmap(z=values, y=y, coloraxis="coloraxis"), row=row, col=1)
    where = "all layers" if layer is None else f"layer {layer}"
    heat.update_layout(title=f"{name}, {where}: coefficients by position" + (" (mean over slots)" if layer is None else ""),
                       height=520, coloraxis={"colorscale": "Viridis"})
    table = e.window_table(condition, window_, layer)
    line = px.line(table, x="position", y="delta", hover_data=["token"], markers=True, height=320,
                   labels={"delta": "ΔNLL (nats)"},
                   title=f"{name}, window {window_}: ΔNLL of {condition} ({where}) against correct")
    return heat, line, table""",
        ),
        (
            "code",
            '''\
first = model or next(iter(checkpoints_))
if first not in checkpoints_:
    raise ValueError(f"model {first!r} is not among the checkpoints: {', '.join(checkpoints_)}")
display(Markdown(f"Opening `{first}` (its eval capture, or the one already in `{run.cache}`) ..."))
run.explorer(checkpoints_[first])

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
            condition_w.options = [c for c in e.conditions if c != "correct"]  # routers add layer_mean_topk
            condition_w.value = condition_ if condition_ in condition_w.options else "cross_input"
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
render()''',
        ),
        (
            "md",
            "The finished audits of these checkpoints and settings as pandas DataFrames, in three lines: load the "
            "audit folders (any `fca reproduce` run's `audits/` works), sort, plot. `load_audits(...)` also gives "
            "`.retention`, `.variance`, `.execution`, `.per_token` (one row per token and condition); "
            "`fca_workbench.load_audit(folder)` opens one audit. The explorer above needs none of them.",
        ),
        (
            "code",
            """\
finished = run.finished_audits()
if finished:
    results = fca_workbench.load_audits(finished)
    display(results.conditions.sort_values("delta", ascending=False))
    tables.show(px.bar(results.conditions, x="condition", y="delta", color="model", barmode="group"))
else:
    display(Markdown(f"No finished audit for these settings in `{run.audits}` yet (`fca reproduce` writes them)."))""",
        ),
        ("md", "The selection the notebook was run with, written as a table and figures (for papermill runs):"),
        (
            "code",
            """\
heat, line, table = figures(model_w.value, None if layer_w.value == ALL else layer_w.value, condition_w.value,
                            window_w.value)
run.write_figure(heat, "explore_coefficients")
run.write_figure(line, "explore_delta_nll")
run.write_table(table)""",
        ),
    ],
    parameters=PARAMETERS
    + """
model = None              # model to open first (checkpoint folder name); None: the first checkpoint
layer = None              # layer to intervene at; None: all layers
condition = "cross_input"  # condition to compare with correct
window_index = 0          # eval window to show""",
    setup="""\
from pathlib import Path

import ipywidgets as widgets
import plotly.express as px
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

import fca_workbench
from fca_workbench.notebooks import tables
from fca_workbench.foundation.errors import UserError
from fca_workbench.notebooks.reproduce import NotebookRun

run = NotebookRun(checkpoints=checkpoints, eval_data=eval_data, calibration_data=calibration_data, window=window,
                  max_windows=max_windows, device=device, dtype=dtype, seed=seed, batch_size=batch_size,
                  per_layer=per_layer, out=out, audits=audits, cache=cache)
run.check()
checkpoints_ = {Path(c).name: c for c in run.checkpoints}  # opened when first selected, not before""",
)

DYNAMICS = notebook(
    "07_training_dynamics",
    "FCA during training: how assignment dependence evolves",
    "Reads the shipped training-dynamics logs (`data/training_dynamics/<run>/audit_log.csv` and `train_log.csv`, "
    "written by `fca train --audit-every 100`; nothing is retrained here). Per run: gap retention of the static "
    "profiles, ΔNLL of each condition against `correct`, R² of layer and layer×slot, and train / eval NLL "
    "against training steps; then a table at a few steps. A run without a model card is unfinished: its logs "
    "are partial.",
    [
        (
            "code",
            """\
for r in runs_:
    state = "finished" if r["card"] else "PARTIAL (unfinished run)"
    display(Markdown(f"**{r['name']}**: audited at steps {', '.join(map(str, r['audit'].step))}; {state}"))""",
        ),
        (
            "code",
            """\
conditions = ["cross_input", "token_shuffle", "global_mean", "layer_scalar", "layer_mean", "layer_position_mean"]
for r in runs_:
    a = r["audit"]
    fig = make_subplots(rows=2, cols=2, subplot_titles=["gap retention of static profiles", "ΔNLL vs correct (nats)",
                                                         "R² of the coefficients", "train loss / eval NLL (nats)"])
    for p in ["layer_mean", "layer_scalar", "layer_position_mean"]:
        fig.add_trace(go.Scatter(x=a.step, y=a[f"retention_{p}"], name=f"retention {p}", mode="lines+markers"), 1, 1)
    for c in conditions:
        fig.add_trace(go.Scatter(x=a.step, y=a[f"delta_{c}"], name=f"Δ {c}", mode="lines+markers"), 1, 2)
    for k in ["r2_layer", "r2_layer_slot"]:
        fig.add_trace(go.Scatter(x=a.step, y=a[k], name=k, mode="lines+markers"), 2, 1)
    if r["train"] is not None:
        fig.add_trace(go.Scatter(x=r["train"].step, y=r["train"].loss, name="train loss", mode="lines"), 2, 2)
    fig.add_trace(go.Scatter(x=a.step, y=a.nll_correct, name="eval NLL (audit windows)", mode="lines+markers"), 2, 2)
    fig.update_layout(title=f"{r['name']}: FCA during training", height=700)
    fig.update_xaxes(title_text="step")
    run.write_figure(fig, f"training_dynamics_{r['name']}")
    tables.show(fig)""",
        ),
        ("code", "run.write_table(tables.training_dynamics_table(runs_, steps))"),
    ],
    parameters="""\
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
runs = None   # training-run folders holding audit_log.csv; None: the shipped data/training_dynamics/*
steps = None  # steps shown in the table; None: 100, 300, 500, ... and each run's last audited step
out = None    # tables/ and figures/ are written here; None: results/notebooks""",
    setup="""\
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun
from fca_workbench.training.training_audit import load_training_runs

run = NotebookRun(out=out)
runs_ = load_training_runs(runs)
if steps is None:
    last = {int(r["audit"].step.iloc[-1]) for r in runs_}
    steps = sorted({s for r in runs_ for s in r["audit"].step if s % 200 == 100} | last)""",
)

# the design studies' figure against each axis (09, 10): the default as the dashed reference, its band shaded
BY_AXIS = """\
axes = [a for a in dict.fromkeys(points.axis) if a != "default"]
COLS = 4


def by_axis(figure, title, percent=False):
    p = points[points.figure == figure]
    default = p[p.axis == "default"]
    rows = -(-len(axes) // COLS)
    fig = make_subplots(rows=rows, cols=COLS, subplot_titles=axes, shared_yaxes="all", vertical_spacing=0.3 / rows)
    for i, axis in enumerate(axes):
        row, col = i // COLS + 1, i % COLS + 1
        q = p[p.axis == axis]
        fig.add_trace(go.Scatter(
            x=q.label, y=q.value, mode="markers", marker={"size": 10, "color": "#1f77b4"}, name="variant",
            legendgroup="variant", showlegend=i == 0, customdata=q[["variant", "error"]],
            error_y={"type": "data", "symmetric": False, "array": q.error_plus, "arrayminus": q.error_minus},
            hovertemplate="%{customdata[0]}: %{y}<br>error bar: %{customdata[1]}<extra></extra>"), row, col)
        spread = q[q.n > 1].explode("values")
        fig.add_trace(go.Scatter(
            x=spread.label, y=spread["values"], mode="markers", marker={"size": 5, "color": "grey"},
            name="one seed", legendgroup="seed", showlegend=i == 0), row, col)
        for d in default.itertuples():
            fig.add_hline(y=d.value, line_dash="dash", line_color="black", row=row, col=col)
            if d.error_minus or d.error_plus:
                fig.add_hrect(y0=d.value - d.error_minus, y1=d.value + d.error_plus, fillcolor="grey", opacity=0.2,
                              line_width=0, row=row, col=col)
    where = f"dashed: the default (n={default.n.iloc[0]})" if len(default) else "no default run"
    fig.update_layout(title=f"{title} by design axis ({where}; error bars: 95% CI for one seed, sd over seeds)",
                      height=330 * rows)
    if percent:
        fig.update_yaxes(tickformat=".0%")
    return fig


"""

DESIGN = notebook(
    "09_controller_design",
    "Controller design: what makes a FeatureGate static?",
    "Reads the controller-design study (`data/controller_design/<variant>-s<seed>/`: each run's "
    "`audit_summary.json` and `model_card.json`, written by `benchmarks/controller_design.py`; nothing is "
    "trained or audited here). Each variant changes one design choice of the default FeatureGate (gate range, "
    "gate input, gate groups, the controllers' weight decay or learning rate, width × depth) or several "
    "(`combo`). Per design axis: gap retention of `layer_mean`, R² of layer, cross-input ΔNLL and eval NLL of "
    "each variant, the default as the dashed reference line (its error band shaded). Error bars: the audit's "
    "95% CI for a variant with one seed, ± the sd over seeds for one with several (each seed a grey dot); "
    "every x label says how many seeds its point has. A run folder that is unfinished or unreadable is named "
    "and left out.",
    [
        (
            "code",
            """\
seeds = tables.design_seed_table(study_.runs)
display(Markdown("Seeds per variant: " + ", ".join(
    f"`{r.variant}` {r.n} ({r.seeds})" for r in seeds.itertuples())))
run.write_table(seeds)""",
        ),
        ("code", "run.write_table(tables.design_runs_table(study_.runs))"),
        ("md", "## Each figure against each design axis"),
        (
            "code",
            """\
points = tables.design_points(study_.runs)
"""
            + BY_AXIS
            + """\
for figure, title, name, percent in [
    ("retention_layer_mean", "Gap retention of layer_mean", "controller_design_retention", True),
    ("r2_layer", "R² of layer", "controller_design_r2_layer", True),
    ("delta_cross_input", "ΔNLL cross_input (nats)", "controller_design_cross_input", False),
    ("eval_nll", "Eval NLL (nats, model card)", "controller_design_eval_nll", False),
]:
    fig = by_axis(figure, title, percent)
    run.write_figure(fig, name)
    tables.show(fig)""",
        ),
    ],
    parameters="""\
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
study = None  # the study folder (benchmarks/controller_design.py --out); None: the shipped data/controller_design
out = None    # tables/ and figures/ are written here; None: results/notebooks""",
    setup="""\
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun

run = NotebookRun(out=out)
study_ = tables.read_design_study(study)
display(Markdown(f"{len(study_.runs)} runs in `{study_.folder}`"))
for line in study_.skipped:
    print("left out:", line)""",
)

FINETUNE_INTRO = (
    "## Can the router be dropped?\n\n"
    "The static top-k export of the shipped MoE and of the study's most and least static designs (highest and "
    "lowest mean `layer_mean_topk` retention), fine-tuned on the train split for 10% of the study's steps (30, "
    "warm-up 5 and cosine: the study's schedule scaled) with its zero routers frozen, so the fine-tuned model "
    "still has no router (`benchmarks/router_design.py --finetune`: `fca train --init EXPORT --freeze-routers`). "
    "Recovered: (export NLL − fine-tuned NLL) / (export NLL − model NLL) on the model card's eval windows, "
    "mean ± sd over seeds (the shipped MoE: one checkpoint, fine-tuned with three seeds). The control: the "
    "model itself, router and all, fine-tuned alike (the model is not converged at 300 steps either)."
)

ROUTER_DESIGN = notebook(
    "10_router_design",
    "Router design: which mixture-of-experts routers are static?",
    "Reads the router-design study (`data/router_design/<variant>-s<seed>/`: each run's `audit_summary.json` "
    "and `model_card.json`, written by `benchmarks/router_design.py`; nothing is trained or audited here). Each "
    "variant changes one design choice of the shipped MoE (a tiny Mixtral: 8 experts, top-2, load-balancing "
    "weight 0.01): experts, top-k, load-balancing weight, router z-loss, the router's input, a shared expert "
    "(GraniteMoeShared, beside its own control without one), width × depth. Each run is audited on 64 windows; "
    "its static top-k export (`fca export --profile layer_mean_topk`: each layer's k static experts, the router "
    "gone) is scored on the model card's 64 eval windows. Per design axis: gap retention of `layer_mean_topk`, "
    "cross-input ΔNLL, eval NLL, the export's eval NLL and its cost over the model, and expert-use entropy (1: "
    "every expert used equally), the default as the dashed reference line. Error bars: the audit's 95% CI for "
    "a variant with one seed (none for the NLLs and the entropy), ± the sd over seeds for one with several; "
    "every x label says how many seeds its point has. An unfinished or unreadable run folder is named and left "
    "out.",
    [
        (
            "code",
            """\
seeds = tables.design_seed_table(study_.runs, study_.kind)
display(Markdown("Seeds per variant: " + ", ".join(
    f"`{r.variant}` {r.n} ({r.seeds})" for r in seeds.itertuples())))
run.write_table(seeds)""",
        ),
        ("code", "run.write_table(tables.design_runs_table(study_.runs, study_.kind))"),
        ("md", "## Each figure against each design axis"),
        (
            "code",
            """\
points = tables.design_points(study_.runs, study_.kind)
"""
            + BY_AXIS
            + """\
for figure, title, name, percent in [
    ("retention_layer_mean_topk", "Gap retention of layer_mean_topk", "router_design_retention_topk", True),
    ("delta_cross_input", "ΔNLL cross_input (nats)", "router_design_cross_input", False),
    ("eval_nll", "Eval NLL (nats, model card)", "router_design_eval_nll", False),
    ("export_eval_nll", "Eval NLL of the static top-k export (nats)", "router_design_export_nll", False),
    ("export_cost", "Export − model eval NLL (nats)", "router_design_export_cost", False),
    ("expert_entropy", "Expert-use entropy (share of log experts)", "router_design_expert_entropy", True),
]:
    fig = by_axis(figure, title, percent)
    run.write_figure(fig, name)
    tables.show(fig)""",
        ),
        ("md", FINETUNE_INTRO),
        (
            "code",
            """\
if (study_.folder / tables.FINETUNE_FOLDER).is_dir():
    finetunes = tables.read_finetunes(study_.folder)
    recovered = tables.finetune_seed_table(finetunes)
    run.write_table(recovered)
    run.write_table(tables.finetune_runs_table(finetunes))
    fig = go.Figure(go.Bar(
        x=[f"{r.role}: {r.model} (n={r.n})" for r in recovered.itertuples()], y=recovered.recovered_mean,
        error_y=dict(type="data", array=recovered.recovered_sd)))
    fig.update_layout(title="Share of the correct → layer_mean_topk gap a fine-tune of the export recovers "
                      "(mean ± sd over seeds)", yaxis_tickformat=".0%", height=420)
    run.write_figure(fig, "router_design_finetune")
    tables.show(fig)
else:
    print(f"no fine-tune stage in {study_.folder} (benchmarks/router_design.py --finetune)")""",
        ),
    ],
    parameters="""\
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
study = None  # the study folder (benchmarks/router_design.py --out); None: the shipped data/router_design
out = None    # tables/ and figures/ are written here; None: results/notebooks""",
    setup="""\
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun

run = NotebookRun(out=out)
study_ = tables.read_design_study(study, tables.ROUTER_STUDY)
display(Markdown(f"{len(study_.runs)} runs in `{study_.folder}`"))
for line in study_.skipped:
    print("left out:", line)""",
)

DOWNSTREAM = notebook(
    "08_downstream",
    "Downstream tasks under static profiles (lm-evaluation-harness)",
    "Does a static profile keep the model's downstream accuracy, not only its NLL? `fca eval` runs lm-eval tasks "
    "(default: the shipped offline `fca_next_line`: after four lines of a play, pick the true next line among "
    "four versions, three with two neighbouring words swapped) with the live model (`correct`) and the frozen "
    "model under each static profile of the calibration set, and writes `downstream.json` beside each audit. "
    "Accuracy ± lm-eval's stderr, and the share of the correct → global_mean accuracy gap each profile keeps. "
    "With the default `limit` the stderr is large: raise it for a real comparison. Needs the `eval` extra.",
    [
        (
            "code",
            """\
downstreams = [
    run_eval(EvalSettings(AuditSettings(c, calibration=calibration_data, window=window, max_windows=calibration_windows,
                                        device=device, dtype=dtype, seed=seed, batch_size=batch_size),
                          comma_names(tasks), comma_names(conditions), limit=limit), run.audit_dir(c))
    for c in evaluated
]
table = downstream_table(downstreams)
run.write_table(table)
run.write_table(gap_table(downstreams))  # what each retention is a share of, and whether it is beyond its noise""",
        ),
        (
            "code",
            """\
fig = go.Figure()
for model, rows in table[table.metric == table.metric.iloc[0]].groupby("model", sort=False):
    fig.add_trace(go.Bar(x=rows.condition, y=rows.value, error_y=dict(type="data", array=rows.stderr), name=model))
fig.update_layout(barmode="group", title=f"{table.task.iloc[0]}: {table.metric.iloc[0]} ± lm-eval's stderr",
                  yaxis_title=table.metric.iloc[0], height=450)
run.write_figure(fig, "downstream_accuracy")
tables.show(fig)""",
        ),
    ],
    parameters=PARAMETERS.replace(
        "checkpoints = None       # checkpoint folders; None: the shipped featuregate-s0..s6, dense-s0, muddpythia-s0, moe-s0, ssm-s0",
        "checkpoints = None       # checkpoint folders; None: the shipped ones (a model without a controller is skipped)",
    )
    + """
tasks = "fca_next_line"  # comma-separated lm-eval tasks; fca_next_line is shipped (data/tasks/) and runs offline
conditions = "correct,global_mean,layer_mean"  # static conditions (correct and global_mean always run)
limit = 16               # documents per task (None: all); small, so the notebook takes well under a minute
calibration_windows = 4  # calibration windows the static profiles come from (None: all)""",
    setup="""\
import plotly.graph_objects as go
from IPython.display import Markdown, display

from fca_workbench.notebooks import tables
from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.downstream import require_lm_eval
from fca_workbench.downstream.eval_settings import EvalSettings, comma_names
from fca_workbench.notebooks.reproduce import NotebookRun

require_lm_eval()  # one line, not a traceback, without the eval extra
from fca_workbench.downstream.evaluation import run_eval
from fca_workbench.downstream.table import downstream_table, gap_table

run = NotebookRun(checkpoints=checkpoints, out=out, audits=audits)
run.check()
evaluated = [c for c in run.checkpoints if load_controlled(c).controllers]  # nothing to compare without one
display(Markdown("Models: " + ", ".join(f"`{c.split('/')[-1]}`" for c in evaluated)))""",
)

NOTEBOOKS = {
    "01_variation": VARIATION,
    "02_assignment": ASSIGNMENT,
    "03_static_profiles": RETENTION,
    "04_execution": EXECUTION,
    "05_muddpythia": MUDD,
    "06_per_layer": PER_LAYER,
    "07_training_dynamics": DYNAMICS,
    "08_downstream": DOWNSTREAM,
    "09_controller_design": DESIGN,
    "10_router_design": ROUTER_DESIGN,
    "explore": EXPLORE,
}


def main() -> None:
    for stem, nb in NOTEBOOKS.items():
        nbformat.validate(nb)
        path = HERE / f"{stem}.ipynb"
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
