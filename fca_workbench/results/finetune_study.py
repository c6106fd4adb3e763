"""The router study's fine-tune stage (``studies/router_design.py --finetune``) as DataFrames: each
fine-tuned static top-k export's eval NLL, and the share of the correct → ``layer_mean_topk`` gap it recovers,
mean ± sd over seeds. Summaries are read and checked as the study's runs are (``design_study.read_checked``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from fca_workbench.foundation.errors import UserError
from fca_workbench.results.audit_tables import seed_summary
from fca_workbench.results.design_study import read_checked
from fca_workbench.results.layout import FINETUNE_FOLDER, FINETUNE_SUMMARY_FILE
from fca_workbench.results.study_kinds import ROUTER_STUDY
from fca_workbench.results.tabular import Column, make_table

if TYPE_CHECKING:  # imported where a table is built, not by `import fca_workbench`
    import pandas as pd

# the fine-tune stage of the router study (``studies/router_design.py --finetune``): the models it fine-tunes
# the exports of, in the order its tables show them, and the figures of each summary
SHIPPED, MOST_STATIC, LEAST_STATIC = "shipped", "most static", "least static"
FINETUNE_COLUMNS = [
    Column("model_eval_nll", "model eval NLL", "float"),
    Column("export_eval_nll", "export eval NLL", "float"),
    Column("finetuned_eval_nll", "fine-tuned export eval NLL", "float"),
    Column("recovered", "share of the gap recovered", "pct"),
    Column("model_finetuned_eval_nll", "model fine-tuned alike (control)", "float"),
]
FINETUNE_FIGURES = tuple(column.key for column in FINETUNE_COLUMNS)  # each a top-level field of a summary
# computed from a summary's figures: the share of the export → control gap the fine-tune closes, which sets
# apart what 30 more steps do for any model from what the router's absence costs
VS_CONTROL = Column("recovered_vs_control", "share of the gap to the control recovered", "pct")
TABLE_COLUMNS = [*FINETUNE_COLUMNS, VS_CONTROL]
FINETUNE_SCHEMA = {
    "type": "object",
    "required": ["run", "role", "source", "seed", "steps", *FINETUNE_FIGURES],
    "properties": {
        "run": {"type": "string", "minLength": 1},
        "role": {"type": "string", "minLength": 1},
        "source": {"type": "string", "minLength": 1},
        "seed": {"type": "integer", "minimum": 0},
        "steps": {"type": "integer", "minimum": 1},
        **{figure: {"type": "number"} for figure in FINETUNE_FIGURES},
    },
}


def read_finetunes(folder: str | Path | None = None) -> list[dict]:
    """Every fine-tune summary of the router study's fine-tune stage (``<study>/finetune/<run>/``), in name
    order; a missing stage, or a summary that is not one, is a one-line ``UserError``."""
    stage = Path(folder or ROUTER_STUDY.folder) / FINETUNE_FOLDER
    names = sorted(p.name for p in stage.iterdir() if p.is_dir()) if stage.is_dir() else []
    if not names:
        raise UserError(f"no fine-tune of the router-design study in {stage} (studies/router_design.py --finetune)")
    return [read_checked(stage, name, FINETUNE_SUMMARY_FILE, FINETUNE_SCHEMA) for name in names]


def with_control_share(run: dict) -> dict:
    """A summary's figures and its ``recovered_vs_control``: (export − fine-tuned) / (export − control)."""
    gap = run["export_eval_nll"] - run["model_finetuned_eval_nll"]
    share = (run["export_eval_nll"] - run["finetuned_eval_nll"]) / gap if gap > 0 else None
    return {**{key: run[key] for key in FINETUNE_FIGURES}, VS_CONTROL.key: share}


def by_role(runs: list[dict]) -> list[dict]:
    """The fine-tunes in table order: the shipped MoE's first, then the most and the least static design's, each
    by source and seed."""
    order = [SHIPPED, MOST_STATIC, LEAST_STATIC]
    return sorted(
        runs, key=lambda r: (order.index(r["role"]) if r["role"] in order else len(order), r["source"], r["seed"])
    )


def finetune_runs_table(runs: list[dict]) -> pd.DataFrame:
    """One row per fine-tune: its role, the model it started from and the figures of its summary."""
    columns = [
        Column("role", "role", "text"),
        Column("source", "fine-tuned export of", "text"),
        Column("seed", "seed", "int"),
        Column("steps", "steps", "int"),
        *TABLE_COLUMNS,
    ]
    rows = [
        {**{key: run[key] for key in ("role", "source", "seed", "steps")}, **with_control_share(run)}
        for run in by_role(runs)
    ]
    return make_table(
        "router_design_finetune_runs",
        "Router design, fine-tuned static top-k exports: each fine-tune's eval NLL (the model card's eval windows)",
        columns,
        rows,
    )


def finetune_seed_table(runs: list[dict]) -> pd.DataFrame:
    """One row per role (the shipped MoE, the most and the least static design): its variant, seeds, and every
    figure as mean ± sd over them (``seeds.summarise``, which reads a summary's ``derived`` figures)."""
    columns = [
        Column("role", "role", "text"),
        Column("model", "variant (or model)", "text"),
        Column("n", "seeds", "int"),
        Column("seeds", "seed numbers", "text"),
        *[Column(c.key, c.header, c.kind, "msd", c.digits) for c in TABLE_COLUMNS],
    ]
    roles: dict[str, list[dict]] = {}
    for run in by_role(runs):
        roles.setdefault(run["role"], []).append(run)
    rows = []
    for role, group in roles.items():
        figures = [{"derived": with_control_share(run)} for run in group]
        keys = [column.key for column in TABLE_COLUMNS]
        summary = seed_summary(figures, [f"derived.{key}" for key in keys])
        rows.append(
            {
                "role": role,
                "model": ", ".join(sorted({run.get("variant") or run["source"] for run in group})),
                "n": len(group),
                "seeds": ", ".join(str(run["seed"]) for run in group),
                **{key: summary[f"derived.{key}"] for key in keys},
            }
        )
    return make_table(
        "router_design_finetune",
        "Router design, fine-tuned static top-k exports: mean ± sd over seeds of the share of the "
        "correct → layer_mean_topk gap the fine-tune recovers",
        columns,
        rows,
    )
