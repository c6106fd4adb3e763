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
# # Coefficient variation and variance decomposition
#
# Do the controller's coefficients vary across tokens and inputs, and how much of their variance is static structure? R² of layer identity, of layer×slot, then adding position or the input window (`audit.json` → `variance`, `variation`); per model and as mean ± sd over seeds. Heatmaps: each coefficient's mean over the eval windows (layer × position, and slot × position per layer); a router's coefficient is its dense gate over the experts (slot = expert).

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
import plotly.express as px
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun

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
run.write_table(tables.variation_table(audited))

# %%
run.write_table(tables.variation_seed_table(audited))

# %% [markdown]
# ## Variance decomposition

# %%
r2 = {c.key: c.header for c in tables.VARIANCE_COLUMNS[:4]}
shares = tables.variation_table(audited).melt(
    id_vars="model", value_vars=list(r2), var_name="figure", value_name="share"
)
fig = px.bar(
    shares.replace({"figure": r2}),
    x="model",
    y="share",
    color="figure",
    barmode="group",
    title="Share of coefficient variance explained",
    range_y=[0, 1],
    labels={"share": "share of variance explained (R²)", "figure": "explained by"},
)
fig.update_layout(yaxis_tickformat=".0%")
run.figure(fig, "variance_decomposition")


# %% [markdown]
# ## Coefficient heatmaps (mean over eval windows)


# %%
def heatmaps(audit):
    cache_ = tables.open_cache(tables.cache_folder(audit, run.audit_dir(audit)))
    means = tables.position_means(cache_)  # per layer [T, *slot], from the audit's own coefficient cache
    rows = len(means) + 1
    fig = make_subplots(
        rows=rows,
        cols=1,
        vertical_spacing=75 / (220 * rows),
        subplot_titles=["layer × position (mean over slots)"]
        + [f"layer {l}: slot × position" for l in range(len(means))],
    )
    fig.add_trace(
        go.Heatmap(
            z=tables.layer_position_matrix(means).tolist(),
            y=[f"layer {l}" for l in range(len(means))],
            coloraxis="coloraxis",
        ),
        row=1,
        col=1,
    )
    routers = tables.routers(audit) or [False] * len(means)
    for l, m in enumerate(means):
        labels = tables.slot_labels(cache_.manifest["slot_shapes"][l], audit["model"]["arch"], routers[l])
        fig.add_trace(go.Heatmap(z=m.flatten(1).T.tolist(), y=labels, coloraxis="coloraxis"), row=l + 2, col=1)
    fig.update_layout(
        title=f"{tables.model_name(audit)}: mean coefficient by position",
        height=220 * rows,
        coloraxis={"colorscale": "Viridis", "colorbar": {"title": "mean coefficient"}},
    )
    fig.update_xaxes(title_text="position", row=rows, col=1)
    return fig


for audit in tables.with_controller(audited):
    fig = heatmaps(audit)
    run.figure(fig, f"heatmap_{tables.model_name(audit)}")
