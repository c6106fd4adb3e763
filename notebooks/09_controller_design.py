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
# Reads the controller-design study (`data/controller_design/<variant>-s<seed>/`: each run's `audit_summary.json` and `model_card.json`, written by `benchmarks/controller_design.py`; nothing is trained or audited here). Each variant changes one design choice of the default FeatureGate (gate range, gate input, gate groups, the controllers' weight decay or learning rate, width × depth) or several (`combo`). Per design axis: gap retention of `layer_mean`, R² of layer, cross-input ΔNLL and eval NLL of each variant, the default as the dashed reference line (its error band shaded). Error bars: the audit's 95% CI for a variant with one seed, ± the sd over seeds for one with several (each seed a grey dot); every x label says how many seeds its point has. A run folder that is unfinished or unreadable is named and left out.

# %% tags=["parameters"]
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
study = None  # the study folder (benchmarks/controller_design.py --out); None: the shipped data/controller_design
out = None    # tables/ and figures/ are written here; None: results/notebooks

# %%
import plotly.graph_objects as go
from IPython.display import Markdown, display
from plotly.subplots import make_subplots

from fca_workbench.notebooks import tables
from fca_workbench.notebooks.reproduce import NotebookRun

run = NotebookRun(out=out)
study_ = tables.read_design_study(study)
display(Markdown(f"{len(study_.runs)} runs in `{study_.folder}`"))
for line in study_.skipped:
    print("left out:", line)

# %%
seeds = tables.design_seed_table(study_.runs)
display(Markdown("Seeds per variant: " + ", ".join(
    f"`{r.variant}` {r.n} ({r.seeds})" for r in seeds.itertuples())))
run.write_table(seeds)

# %%
run.write_table(tables.design_runs_table(study_.runs))

# %% [markdown]
# ## Each figure against each design axis

# %%
points = tables.design_points(study_.runs)
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
    ("retention_layer_mean", "Gap retention of layer_mean", "controller_design_retention", True),
    ("r2_layer", "R² of layer", "controller_design_r2_layer", True),
    ("delta_cross_input", "ΔNLL cross_input (nats)", "controller_design_cross_input", False),
    ("eval_nll", "Eval NLL (nats, model card)", "controller_design_eval_nll", False),
]:
    fig = by_axis(figure, title, percent)
    run.write_figure(fig, name)
    tables.show(fig)
