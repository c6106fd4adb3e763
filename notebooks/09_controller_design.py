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
# # Controller design: what makes a FeatureGate static?
#
# Reads the controller-design study (`data/controller_design/<variant>-s<seed>/`: each run's `audit_summary.json` and `model_card.json`, written by `studies/controller_design.py`; nothing is trained or audited here). Each variant changes one design choice of the default FeatureGate (gate range, gate input, gate groups, the controllers' weight decay or learning rate, width × depth) or several (`combo`). Per design axis: gap retention of `layer_mean`, R² of layer, cross-input ΔNLL and eval NLL of each variant, the default as the dashed reference line (its error band shaded). Error bars: the audit's 95% CI for a variant with one seed, ± the sd over seeds for one with several (each seed a grey dot); every x label says how many seeds its point has. A run folder that is unfinished or unreadable is named and left out.

# %% tags=["parameters"]
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
study = None  # the study folder (studies/controller_design.py --out); None: the shipped data/controller_design
out = None  # tables/ and figures/ are written here; None: results/notebooks

# %%
from IPython.display import Markdown, display

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun
from fca_workbench.results.conditions import CROSS_INPUT, LAYER_MEAN

tables.use_paper_style()  # Okabe-Ito colours on white, for every figure below
run = NotebookRun(out=out)
study_ = tables.read_design_study(study)
caption = f"{len(study_.runs)} runs in {study_.folder.name}/ (audit_summary.json and model_card.json of each)"
display(Markdown(f"{len(study_.runs)} runs in `{study_.folder}`"))
for line in study_.skipped:
    print("left out:", line)

# %%
seeds = tables.design_seed_table(study_.runs)
display(Markdown("Seeds per variant: " + ", ".join(f"`{r.variant}` {r.n} ({r.seeds})" for r in seeds.itertuples())))
run.write_table(seeds)

# %%
run.write_table(tables.design_runs_table(study_.runs))

# %% [markdown]
# ## Each figure against each design axis

# %%
points = tables.design_points(study_.runs)
for figure, title, name, percent in [
    (f"retention_{LAYER_MEAN}", f"Gap retention of {LAYER_MEAN}", "controller_design_retention", True),
    ("r2_layer", "R² of layer", "controller_design_r2_layer", True),
    (f"delta_{CROSS_INPUT}", f"ΔNLL {CROSS_INPUT} (nats)", "controller_design_cross_input", False),
    ("eval_nll", "Eval NLL (nats, model card)", "controller_design_eval_nll", False),
]:
    run.figure(tables.design_axis_figure(points, figure, title, percent), name, caption)
