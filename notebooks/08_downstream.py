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
# Does a static profile keep the model's downstream accuracy, not only its NLL? `fca eval` runs lm-eval tasks (default: the shipped offline `fca_next_line`: after four lines of a play, pick the true next line among four versions, three with two neighbouring words swapped) with the live model (`correct`) and the frozen model under each static profile of the calibration set, and writes `downstream.json` beside each audit. Each condition's accuracy gap against `correct`, paired over the same documents, with a standard error clustered by play (the items come from 4 plays, so the interval uses Student's t on 3 degrees of freedom), and the share of the correct → reference gap each static profile keeps, with its interval (reference: `global_mean`, or `random_topk` for a router's `layer_mean_topk`); a retention whose gap does not resolve is shown as unresolved, not as a percentage. The defaults evaluate all 1,600 `fca_play_choice` items (fewer drop whole plays: the first 400 are one play, which gives no clustered error at all) with profiles from 4 calibration windows: the smallest setting that resolves the gaps the committed `data/downstream` results resolve (docs/guides/downstream.md). Needs the `eval` extra.

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
tasks = "fca_play_choice"  # comma-separated lm-eval tasks; fca_play_choice is shipped (data/tasks/) and runs offline
conditions = None  # comma-separated static conditions; None: every static one each model replays
limit = None  # documents per task (None: all 1,600, all 4 plays: ~25 s per condition and model on one CPU core)
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
from fca_workbench.results.conditions import REFERENCE

require_lm_eval()  # one line, not a traceback, without the eval extra
from fca_workbench.downstream.evaluation import run_eval
from fca_workbench.downstream.table import downstream_table, format_downstream, gap_table

tables.use_paper_style()  # Okabe-Ito colours on white, for every figure below
run = NotebookRun(checkpoints=checkpoints, out=out, audits=audits)
run.check()
evaluated = [c for c in run.checkpoints if load_controlled(c).controllers]  # nothing to compare without one
display(Markdown("Models: " + ", ".join(f"`{c.split('/')[-1]}`" for c in evaluated)))

# %%
chosen = comma_names(conditions) if conditions else None
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
    downstream = run_eval(
        EvalSettings(calibration, comma_names(tasks), limit=limit, conditions=chosen), run.audit_dir(c)
    )
    assert downstream is not None  # one process: it returns what it wrote
    downstreams.append(downstream)
table = downstream_table(downstreams)
gaps = gap_table(downstreams)
run.write_table(table)
run.write_table(gaps)  # each condition's gap against correct, its clustered error and whether it resolves
for downstream in downstreams:  # what fca eval prints: retention with its interval and reference, or unresolved
    display(Markdown("```text\n" + format_downstream(downstream) + "\n```"))

# %%
fig = go.Figure()
first = gaps[gaps.metric == gaps.metric.iloc[0]]
for model, rows in first.groupby("model", sort=False):
    fig.add_trace(
        go.Bar(
            x=rows.condition,
            y=rows.gap,
            error_y=dict(
                type="data", symmetric=False, array=rows.ci95_hi - rows.gap, arrayminus=rows.gap - rows.ci95_lo
            ),
            name=model,
        )
    )
fig.add_hline(y=0, line_dash="dot", annotation_text=REFERENCE)
fig.update_layout(
    barmode="group",
    title=f"{first.task.iloc[0]}: {REFERENCE} − condition, {first.metric.iloc[0]}, 95% CI clustered by play (t, G − 1 df)",
    yaxis_title=f"{first.metric.iloc[0]} lost against {REFERENCE} (share of documents)",
    xaxis_title="condition",
    height=450,
)
plays = ", ".join(sorted({str(g) for g in first.clusters.dropna().astype(int)}))
caption = f"{', '.join(first.model.unique())}; {limit or 'all'} documents per task in {plays} clusters; seed {seed}"
run.figure(fig, "downstream_gaps", caption=caption)
