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
# # Static profiles: gap retention
#
# How much of the Correct-to-GlobalMean NLL gap does a static profile estimated on the calibration set retain? `(NLL_global_mean − NLL_P) / (NLL_global_mean − NLL_correct)` for the layerwise profile (`layer_mean`), one scalar per layer (`layer_scalar`) and per layer and position (`layer_position_mean`) (`audit.json` → `retention`). The paper reports 98.70% (seven 76M FeatureGate seeds) and 99.43% (three 504M ones) for `layer_mean`, as mean ± sd over seeds: the second table.

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
from IPython.display import Markdown, display

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
run.write_table(tables.retention_table(audited))

# %%
main = tables.retention_seed_table(audited)
run.write_table(main)

# %%
bars = tables.retention_points(audited)
if bars.empty:  # a retention whose gap does not resolve is no figure, so nothing to draw
    display(Markdown("No static profile's retention resolves here: every gap's 95% CI holds 0 (more windows help)."))
else:
    fig = px.bar(
        bars,
        x="profile",
        y="value",
        error_y="error_plus",
        error_y_minus="error_minus",
        color="arch",
        barmode="group",
        hover_data=["error", "reference"],
        title="Gap retention of static profiles over their reference (ratio of means over seeds, 95% CI)",
        labels={"value": "gap retained (share of NLL gap)", "profile": "static profile"},
    )
    fig.update_layout(yaxis_tickformat=".1%")
    run.figure(fig, "retention")
