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
# # Downstream tasks under static profiles (lm-evaluation-harness)
#
# Does a static profile keep the model's downstream accuracy, not only its NLL? `fca eval` runs lm-eval tasks (default: the shipped offline `fca_next_line`: after four lines of a play, pick the true next line among four versions, three with two neighbouring words swapped) with the live model (`correct`) and the frozen model under each static profile of the calibration set, and writes `downstream.json` beside each audit. Accuracy ± lm-eval's stderr, and the share of the correct → global_mean accuracy gap each profile keeps. With the default `limit` the stderr is large: raise it for a real comparison. Needs the `eval` extra.

# %% tags=["parameters"]
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
checkpoints = None  # checkpoint folders; None: the shipped ones (a model without a controller is skipped)
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
tasks = "fca_next_line"  # comma-separated lm-eval tasks; fca_next_line is shipped (data/tasks/) and runs offline
conditions = None  # comma-separated static conditions; None: fca eval's (correct and global_mean always run)
limit = 16  # documents per task (None: all); small, so the notebook takes well under a minute
calibration_windows = 4  # calibration windows the static profiles come from (None: all)

# %%
import plotly.graph_objects as go
from IPython.display import Markdown, display

from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.downstream import require_lm_eval
from fca_workbench.downstream.eval_settings import EvalSettings, comma_names
from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun

require_lm_eval()  # one line, not a traceback, without the eval extra
from fca_workbench.downstream.evaluation import run_eval
from fca_workbench.downstream.table import downstream_table, gap_table

tables.use_paper_style()  # Okabe-Ito colours on white, for every figure below
run = NotebookRun(checkpoints=checkpoints, out=out, audits=audits)
run.check()
evaluated = [c for c in run.checkpoints if load_controlled(c).controllers]  # nothing to compare without one
display(Markdown("Models: " + ", ".join(f"`{c.split('/')[-1]}`" for c in evaluated)))

# %%
chosen: dict[str, list[str]] = {"conditions": comma_names(conditions)} if conditions else {}
downstreams = []
for c in evaluated:
    calibration = AuditSettings(
        c,
        calibration=calibration_data,
        window=window,
        max_windows=calibration_windows,
        device=device,
        dtype=dtype,
        seed=seed,
        batch_size=batch_size,
    )
    downstream = run_eval(EvalSettings(calibration, comma_names(tasks), limit=limit, **chosen), run.audit_dir(c))
    assert downstream is not None  # one process: it returns what it wrote
    downstreams.append(downstream)
table = downstream_table(downstreams)
run.write_table(table)
run.write_table(gap_table(downstreams))  # what each retention is a share of, and whether it is beyond its noise

# %%
fig = go.Figure()
for model, rows in table[table.metric == table.metric.iloc[0]].groupby("model", sort=False):
    fig.add_trace(go.Bar(x=rows.condition, y=rows.value, error_y=dict(type="data", array=rows.stderr), name=model))
fig.update_layout(
    barmode="group",
    title=f"{table.task.iloc[0]}: {table.metric.iloc[0]} ± lm-eval's stderr",
    yaxis_title=f"{table.metric.iloc[0]} (share of documents)",
    xaxis_title="condition",
    height=450,
)
caption = f"{', '.join(table.model.unique())}; {limit or 'all'} documents per task; seed {seed}"
run.figure(fig, "downstream_accuracy", caption=caption)
