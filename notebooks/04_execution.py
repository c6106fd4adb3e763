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
# # Conditional execution
#
# Does the model skip computation because of its coefficients, and is it faster than its baseline? Blocks executed / present, controller calls, FLOPs of one batch and median latency against the baseline (`audit.json` → `execution`): a shape-matched Dense, or for a mixture of experts the static mixture that runs every expert for every token. The MoE row is where conditional execution is real: its routers run k of E experts per token (`expert_fraction_executed`). The positive control is a copy of each FeatureGate that really skips the MLP rows whose gates all fall below the calibration median (`execution.positive_control`): its fraction executed must fall below 1, which shows the audit can see a saving where one exists.

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
import pandas as pd
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
run.write_table(tables.execution_table(audited))

# %% [markdown]
# The positive control of each FeatureGate (`audit.json` → `execution.positive_control`):

# %%
run.write_table(tables.positive_control_table(audited))

# %%
run.write_table(tables.execution_seed_table(audited))

# %%
figures = {
    "fraction_executed": "fraction of branch work executed",
    "expert_fraction_executed": "fraction of expert evaluations run",
    "latency_ratio_vs_dense": "latency / baseline",
}
runs = pd.concat(
    [
        tables.execution_table(audited).assign(run="model"),
        tables.positive_control_table(audited).assign(run="positive control"),
    ]
)
bars = runs.melt(id_vars=["model", "run"], value_vars=list(figures), var_name="figure").replace({"figure": figures})
fig = px.bar(
    bars,
    x="model",
    y="value",
    color="run",
    facet_col="figure",
    barmode="group",
    title="Conditional execution (ratios, 1 = the baseline's work or time)",
    labels={"value": "ratio", "run": ""},
)
fig.for_each_annotation(lambda a: a.update(text=a.text.removeprefix("figure=")))
fig.update_yaxes(matches=None, showticklabels=True)
run.figure(fig, "execution")
