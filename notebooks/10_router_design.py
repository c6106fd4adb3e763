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
# # Router design: which mixture-of-experts routers are static?
#
# Reads the router-design study (`data/router_design/<variant>-s<seed>/`: each run's `audit_summary.json` and `model_card.json`, written by `studies/router_design.py`; nothing is trained or audited here). Each variant changes one design choice of the shipped MoE (a tiny Mixtral: 8 experts, top-2, load-balancing weight 0.01): experts, top-k, load-balancing weight, router z-loss, the router's input, a shared expert (GraniteMoeShared, beside its own control without one), width × depth. Each run is audited on 64 windows; its static top-k export (`fca export --profile layer_mean_topk`: each layer's k static experts, the router gone) is scored on the model card's 64 eval windows. Per design axis: gap retention of `layer_mean_topk`, cross-input ΔNLL, eval NLL, the export's eval NLL and its cost over the model, and expert-use entropy (1: every expert used equally), the default as the dashed reference line. Error bars: the audit's 95% CI for a variant with one seed (none for the NLLs and the entropy), ± the sd over seeds for one with several; every x label says how many seeds its point has. An unfinished or unreadable run folder is named and left out.

# %% tags=["parameters"]
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
study = None  # the study folder (studies/router_design.py --out); None: the shipped data/router_design
out = None  # tables/ and figures/ are written here; None: results/notebooks

# %%
import plotly.graph_objects as go
from IPython.display import Markdown, display

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun
from fca_workbench.results.conditions import CROSS_INPUT, LAYER_MEAN_TOPK, REFERENCE

tables.use_paper_style()  # Okabe-Ito colours on white, for every figure below
run = NotebookRun(out=out)
study_ = tables.read_design_study(study, tables.ROUTER_STUDY)
caption = f"{len(study_.runs)} runs in {study_.folder.name}/ (audit_summary.json and model_card.json of each)"
display(Markdown(f"{len(study_.runs)} runs in `{study_.folder}`"))
for line in study_.skipped:
    print("left out:", line)

# %%
seeds = tables.design_seed_table(study_.runs, study_.kind)
display(Markdown("Seeds per variant: " + ", ".join(f"`{r.variant}` {r.n} ({r.seeds})" for r in seeds.itertuples())))
run.write_table(seeds)

# %%
run.write_table(tables.design_runs_table(study_.runs, study_.kind))

# %% [markdown]
# ## Each figure against each design axis

# %%
points = tables.design_points(study_.runs, study_.kind)
for figure, title, name, percent in [
    (f"retention_{LAYER_MEAN_TOPK}", f"Gap retention of {LAYER_MEAN_TOPK}", "router_design_retention_topk", True),
    (f"delta_{CROSS_INPUT}", f"ΔNLL {CROSS_INPUT} (nats)", "router_design_cross_input", False),
    ("eval_nll", "Eval NLL (nats, model card)", "router_design_eval_nll", False),
    ("export_eval_nll", "Eval NLL of the static top-k export (nats)", "router_design_export_nll", False),
    ("export_cost", "Export − model eval NLL (nats)", "router_design_export_cost", False),
    ("expert_entropy", "Expert-use entropy (share of log experts)", "router_design_expert_entropy", True),
]:
    run.figure(tables.design_axis_figure(points, figure, title, percent), name, caption)

# %% [markdown]
# ## Can the router be dropped?
#
# The static top-k export of the shipped MoE and of the study's most and least static designs (highest and lowest mean `layer_mean_topk` retention), fine-tuned on the train split for 10% of the study's steps (30, warm-up 5 and cosine: the study's schedule scaled) with its zero routers frozen, so the fine-tuned model still has no router (`studies/router_design.py --finetune`: `fca train --init EXPORT --freeze-routers`). Recovered: (export NLL − fine-tuned NLL) / (export NLL − model NLL) on the model card's eval windows, mean ± sd over seeds (the shipped MoE: one checkpoint, fine-tuned with three seeds). The control: the model itself, router and all, fine-tuned alike (the model is not converged at 300 steps either).

# %%
if (study_.folder / tables.FINETUNE_FOLDER).is_dir():
    finetunes = tables.read_finetunes(study_.folder)
    recovered = tables.finetune_seed_table(finetunes)
    run.write_table(recovered)
    run.write_table(tables.finetune_runs_table(finetunes))
    fig = go.Figure(
        go.Bar(
            x=[f"{r.role}: {r.model} (n={r.n})" for r in recovered.itertuples()],
            y=recovered.recovered_mean,
            error_y=dict(type="data", array=recovered.recovered_sd),
        )
    )
    fig.update_layout(
        title=f"Share of the {REFERENCE} → {LAYER_MEAN_TOPK} gap a fine-tune of the export recovers "
        "(mean ± sd over seeds)",
        yaxis_title="share of the NLL gap recovered",
        yaxis_tickformat=".0%",
        height=420,
    )
    run.figure(fig, "router_design_finetune", f"{len(finetunes)} fine-tunes in {study_.folder.name}/finetune/")
else:
    print(f"no fine-tune stage in {study_.folder} (studies/router_design.py --finetune)")
