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
# Reads the router-design study (`data/router_design/<variant>-s<seed>/`: each run's `audit_summary.json` and `model_card.json`, written by `benchmarks/router_design.py`; nothing is trained or audited here). Each variant changes one design choice of the shipped MoE (a tiny Mixtral: 8 experts, top-2, load-balancing weight 0.01): experts, top-k, load-balancing weight, router z-loss, the router's input, a shared expert (GraniteMoeShared, beside its own control without one), width × depth. Each run is audited on 64 windows; its static top-k export (`fca export --profile layer_mean_topk`: each layer's k static experts, the router gone) is scored on the model card's 64 eval windows. Per design axis: gap retention of `layer_mean_topk`, cross-input ΔNLL, eval NLL, the export's eval NLL and its cost over the model, and expert-use entropy (1: every expert used equally), the default as the dashed reference line. Error bars: the audit's 95% CI for a variant with one seed (none for the NLLs and the entropy), ± the sd over seeds for one with several; every x label says how many seeds its point has. An unfinished or unreadable run folder is named and left out.

# %% tags=["parameters"]
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
study = None  # the study folder (benchmarks/router_design.py --out); None: the shipped data/router_design
out = None    # tables/ and figures/ are written here; None: results/notebooks

# %%
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun

run = NotebookRun(out=out)
study_ = tables.read_design_study(study, tables.ROUTER_STUDY)
display(Markdown(f"{len(study_.runs)} runs in `{study_.folder}`"))
for line in study_.skipped:
    print("left out:", line)

# %%
seeds = tables.design_seed_table(study_.runs, study_.kind)
display(Markdown("Seeds per variant: " + ", ".join(
    f"`{r.variant}` {r.n} ({r.seeds})" for r in seeds.itertuples())))
run.write_table(seeds)

# %%
run.write_table(tables.design_runs_table(study_.runs, study_.kind))

# %% [markdown]
# ## Each figure against each design axis

# %%
points = tables.design_points(study_.runs, study_.kind)
axes = [a for a in dict.fromkeys(points.axis) if a != "default"]
COLS = 4


def by_axis(figure, title, percent=False):
    p = points[points.figure == figure]
    default = p[p.axis == "default"]
    rows = -(-len(axes) // COLS)
    fig = make_subplots(rows=rows, cols=COLS, subplot_titles=axes, shared_yaxes="all", vertical_spacing=0.3 / rows)
    for i, axis in enumerate(axes):
        row, col = i // COLS + 1, i % COLS + 1
        q = p[p.axis == axis]
        fig.add_trace(go.Scatter(
            x=q.label, y=q.value, mode="markers", marker={"size": 10, "color": "#1f77b4"}, name="variant",
            legendgroup="variant", showlegend=i == 0, customdata=q[["variant", "error"]],
            error_y={"type": "data", "symmetric": False, "array": q.error_plus, "arrayminus": q.error_minus},
            hovertemplate="%{customdata[0]}: %{y}<br>error bar: %{customdata[1]}<extra></extra>"), row, col)
        spread = q[q.n > 1].explode("values")
        fig.add_trace(go.Scatter(
            x=spread.label, y=spread["values"], mode="markers", marker={"size": 5, "color": "grey"},
            name="one seed", legendgroup="seed", showlegend=i == 0), row, col)
        for d in default.itertuples():
            fig.add_hline(y=d.value, line_dash="dash", line_color="black", row=row, col=col)
            if d.error_minus or d.error_plus:
                fig.add_hrect(y0=d.value - d.error_minus, y1=d.value + d.error_plus, fillcolor="grey", opacity=0.2,
                              line_width=0, row=row, col=col)
    where = f"dashed: the default (n={default.n.iloc[0]})" if len(default) else "no default run"
    fig.update_layout(title=f"{title} by design axis ({where}; error bars: 95% CI for one seed, sd over seeds)",
                      height=330 * rows)
    if percent:
        fig.update_yaxes(tickformat=".0%")
    return fig


for figure, title, name, percent in [
    ("retention_layer_mean_topk", "Gap retention of layer_mean_topk", "router_design_retention_topk", True),
    ("delta_cross_input", "ΔNLL cross_input (nats)", "router_design_cross_input", False),
    ("eval_nll", "Eval NLL (nats, model card)", "router_design_eval_nll", False),
    ("export_eval_nll", "Eval NLL of the static top-k export (nats)", "router_design_export_nll", False),
    ("export_cost", "Export − model eval NLL (nats)", "router_design_export_cost", False),
    ("expert_entropy", "Expert-use entropy (share of log experts)", "router_design_expert_entropy", True),
]:
    fig = by_axis(figure, title, percent)
    run.write_figure(fig, name)
    tables.show(fig)

# %% [markdown]
# ## Can the router be dropped?
#
# The static top-k export of the shipped MoE and of the study's most and least static designs (highest and lowest mean `layer_mean_topk` retention), fine-tuned on the train split for 10% of the study's steps (30, warm-up 5 and cosine: the study's schedule scaled) with its zero routers frozen, so the fine-tuned model still has no router (`benchmarks/router_design.py --finetune`: `fca train --init EXPORT --freeze-routers`). Recovered: (export NLL − fine-tuned NLL) / (export NLL − model NLL) on the model card's eval windows, mean ± sd over seeds (the shipped MoE: one checkpoint, fine-tuned with three seeds). The control: the model itself, router and all, fine-tuned alike (the model is not converged at 300 steps either).

# %%
if (study_.folder / tables.FINETUNE_FOLDER).is_dir():
    finetunes = tables.read_finetunes(study_.folder)
    recovered = tables.finetune_seed_table(finetunes)
    run.write_table(recovered)
    run.write_table(tables.finetune_runs_table(finetunes))
    fig = go.Figure(go.Bar(
        x=[f"{r.role}: {r.model} (n={r.n})" for r in recovered.itertuples()], y=recovered.recovered_mean,
        error_y=dict(type="data", array=recovered.recovered_sd)))
    fig.update_layout(title="Share of the correct → layer_mean_topk gap a fine-tune of the export recovers "
                      "(mean ± sd over seeds)", yaxis_tickformat=".0%", height=420)
    run.write_figure(fig, "router_design_finetune")
    tables.show(fig)
else:
    print(f"no fine-tune stage in {study_.folder} (benchmarks/router_design.py --finetune)")
