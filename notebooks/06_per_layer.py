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
# # Per layer: which decoder layer's assignment carries the dependence
#
# Each condition applied at one decoder layer alone, all the controllers in that layer together, every other layer keeping its correct coefficients (`audit.json` → `per_layer`, audits run with `per_layer = True`; each replay resumes from the kept state before its layer). Where a layer holds more than one controller (a router and a shared-expert gate), each controller alone has its own rows, named by its module path (`per_controller`). ΔNLL against `correct` with 95% bootstrap CIs over windows per model, then mean ± sd over seeds; the heatmap shows the seed mean per architecture, layer × condition.

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

# %%
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

from fca_workbench.notebooks import tables
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
audited = run.load_audits()  # run_audit per checkpoint, or the audit.json already there for these settings
display(Markdown("Models: " + ", ".join(f"`{tables.model_name(a)}` ({a['model']['arch']})" for a in audited)))

# %%
swept = [a for a in audited if a.get("per_layer")]
if not swept:
    raise ValueError("no audit with a per-layer sweep among the checkpoints given (run with per_layer = True)")
for audit in swept:
    display(
        Markdown(
            f"**{tables.model_name(audit)}** (sweep: {audit['settings']['per_layer_mode']}): "
            f"{audit['verdict']['assignment_dependence']}"
        )
    )

# %%
run.write_table(tables.per_layer_table(swept))
# %%
alone = tables.per_controller_table(swept)
if len(alone):  # only models with decoder layers of several controllers have these rows
    run.write_table(alone)

# %%
seeds = tables.per_layer_seed_table(swept)
run.write_table(seeds)

# %% [markdown]
# ## ΔNLL by decoder layer and condition (mean over seeds)
#
# Each architecture on its own colour scale (their ΔNLLs differ by orders of magnitude), each cell's value written in it.

# %%
archs = list(dict.fromkeys(seeds["arch"]))
fig = make_subplots(rows=len(archs), cols=1, subplot_titles=archs, vertical_spacing=0.25 / len(archs))
for i, arch in enumerate(archs, start=1):
    grid = seeds[seeds["arch"] == arch].pivot(index="layer", columns="condition", values="delta_mean")
    low, high = fig.get_subplot(i, 1).yaxis.domain
    fig.add_trace(
        go.Heatmap(
            z=grid.to_numpy(),
            x=list(grid.columns),
            y=[f"layer {l}" for l in grid.index],
            colorscale="Viridis",
            colorbar={"title": "ΔNLL (nats)", "y": (low + high) / 2, "len": high - low},
            texttemplate="%{z:+.3f}",
            hovertemplate="%{y}, %{x}: ΔNLL %{z:+.4f}<extra></extra>",
        ),
        row=i,
        col=1,
    )
fig.update_layout(
    title=f"ΔNLL against {REFERENCE}, one condition at one decoder layer alone (mean over seeds)",
    height=320 * len(archs),
)
run.figure(fig, "per_layer_heatmap")
