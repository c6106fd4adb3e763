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
# # FCA during training: how assignment dependence evolves
#
# Reads the shipped training-dynamics logs (`data/training_dynamics/<run>/audit_log.csv` and `train_log.csv`, written by `fca train --audit-every 100`; nothing is retrained here). Per run: gap retention of the static profiles, ΔNLL of each condition against `correct`, R² of layer and layer×slot, and train / eval NLL against training steps; then a table at a few steps. A run without a model card is unfinished: its logs are partial.

# %% tags=["parameters"]
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
runs = None  # training-run folders holding audit_log.csv; None: the shipped data/training_dynamics/*
steps = None  # steps shown in the table; None: 100, 300, 500, ... and each run's last audited step
out = None  # tables/ and figures/ are written here; None: results/notebooks

# %%
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun
from fca_workbench.results.conditions import REFERENCE, condition_names
from fca_workbench.training.training_audit import load_training_runs

tables.use_paper_style()  # Okabe-Ito colours on white, for every figure below
run = NotebookRun(out=out)
runs_ = load_training_runs(runs)
if steps is None:
    last = {int(r["audit"].step.iloc[-1]) for r in runs_}
    steps = sorted({s for r in runs_ for s in r["audit"].step if s % 200 == 100} | last)

# %%
for r in runs_:
    state = "finished" if r["card"] else "PARTIAL (unfinished run)"
    display(Markdown(f"**{r['name']}**: audited at steps {', '.join(map(str, r['audit'].step))}; {state}"))

# %%
for r in runs_:
    a = r["audit"]
    replayed = condition_names(lambda c: c.intervention)
    conditions = [c for c in replayed if f"delta_{c}" in a]  # what this run's audits replayed
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=[
            "gap retention of static profiles",
            f"ΔNLL against {REFERENCE} (nats)",
            "R² of the coefficients",
            "train loss / eval NLL (nats)",
        ],
    )
    for p in [p for p in tables.RETENTION_PROFILES if f"retention_{p}" in a]:
        fig.add_trace(go.Scatter(x=a.step, y=a[f"retention_{p}"], name=f"retention {p}", mode="lines+markers"), 1, 1)
    for c in conditions:
        fig.add_trace(go.Scatter(x=a.step, y=a[f"delta_{c}"], name=f"Δ {c}", mode="lines+markers"), 1, 2)
    for k in ["r2_layer", "r2_layer_slot"]:
        fig.add_trace(go.Scatter(x=a.step, y=a[k], name=k, mode="lines+markers"), 2, 1)
    if r["train"] is not None:
        fig.add_trace(go.Scatter(x=r["train"].step, y=r["train"].loss, name="train loss", mode="lines"), 2, 2)
    fig.add_trace(
        go.Scatter(x=a.step, y=a[f"nll_{REFERENCE}"], name="eval NLL (audit windows)", mode="lines+markers"), 2, 2
    )
    fig.update_layout(title=f"{r['name']}: FCA during training", height=700)
    fig.update_xaxes(title_text="training step")
    fig.update_yaxes(tickformat=".0%", row=1, col=1)
    fig.update_yaxes(tickformat=".0%", row=2, col=1)
    state = "finished" if r["card"] else "unfinished"
    run.figure(
        fig, f"training_dynamics_{r['name']}", caption=f"{r['name']} ({state}): its audit_log.csv and train_log.csv"
    )

# %%
run.write_table(tables.training_dynamics_table(runs_, steps))
