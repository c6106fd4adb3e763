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
# # Assignment dependence: NLL and ΔNLL under every condition
#
# Does the frozen model care which coefficients go to which input? Mean next-token NLL (nats) of the frozen replay under each condition, and ΔNLL against `correct`, with 95% bootstrap CIs over windows (`audit.json` → `conditions`); per model, then mean ± sd over seeds. For routers, `layer_mean_topk` is the static sparse model: each layer's k experts with the largest mean gate, for every token.

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
run.write_table(tables.assignment_table(audited))

# %%
run.write_table(tables.assignment_seed_table(audited))

# %% [markdown]
# ## ΔNLL with 95% CIs

# %%
table = tables.assignment_table(audited)
table = table[table.condition != REFERENCE]
fig = px.scatter(
    table,
    x="condition",
    y="delta",
    color="model",
    error_y=table.delta_ci95_hi - table.delta,
    error_y_minus=table.delta - table.delta_ci95_lo,
    title=f"ΔNLL against {REFERENCE} (95% CI)",
    labels={"delta": f"ΔNLL against {REFERENCE} (nats)"},
)
fig.update_layout(scattermode="group")
run.figure(fig, "assignment_delta_nll")
