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
# # MUDDPythia: cross-input and token-shuffle penalties
#
# The MUDDPythia table for the checkpoints given (default: the shipped MUDDPythia-tiny; any official MUDDPythia folder works): NLL and ΔNLL against `correct` when each window gets another window's complete coefficients (`cross_input`) or its positions are shuffled (`token_shuffle`), with the static profiles for comparison (`audit.json` → `conditions`). For reference, the paper reports +1.9067 (cross-input) and +2.9637 (shuffle) nats for MUDDPythia-1.4B.
#
# **Those 1.4B figures are not reproduced here.** The shipped checkpoint is a tiny MUDDPythia trained on the shipped corpus, and the workbench runs without the network, so nothing below says anything about MUDDPythia-1.4B. What would: on a CUDA machine with about 8 GB of GPU memory, put the official weights in the local Hugging Face cache and audit them (`--eval` the text the comparison should be made on; the shipped eval split otherwise):
#
# ```
# hf download Caiyun-AI/MUDDPythia-1.4B
# HF_HUB_OFFLINE=1 fca audit Caiyun-AI/MUDDPythia-1.4B --device cuda --dtype bfloat16 --window 2048 --out results/mudd-1.4b
# ```
#
# and read `results/mudd-1.4b/audit.json` → `conditions` (or run this notebook with `checkpoints=["Caiyun-AI/MUDDPythia-1.4B"]`, `device="cuda"`, `dtype="bfloat16"`, `window=2048`, `max_windows=None`). The paper's figures are on its own evaluation text; a comparison with them needs that text as `--eval`. The workbench's re-implementation is checked bit-exact against the reference code by `MUDDPYTHIA_REFERENCE=/path/to/MUDDFormer/pytorch/muddpythia pytest tests/test_muddpythia.py tests/test_official_layout.py` (skipped without it). See `docs/guides/official-checkpoints.md`.

# %% tags=["parameters"]
# Parameters: papermill (and `fca reproduce`) inject overrides after this cell. None means the embedded default.
checkpoints = None  # checkpoint folders; None: the shipped muddpythia-s0
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
from fca_workbench.notebooks.reproduce import NotebookRun, shipped_checkpoints
from fca_workbench.results.conditions import CROSS_INPUT, REFERENCE, TOKEN_SHUFFLE

checkpoints = checkpoints or shipped_checkpoints(["muddpythia-s0"])
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
mudds = [a for a in audited if a["model"]["arch"] == "muddpythia"]
if not mudds:
    raise ValueError("no MUDDPythia checkpoint among the checkpoints given: " + ", ".join(run.checkpoints))
run.write_table(tables.mudd_table(mudds))

# %%
for audit in mudds:
    cross, shuffle = audit["conditions"][CROSS_INPUT], audit["conditions"][TOKEN_SHUFFLE]
    display(
        Markdown(
            f"**{tables.model_name(audit)}**: cross-input reassignment {cross['delta']:+.4f} nats "
            f"[{cross['delta_ci95'][0]:+.4f}, {cross['delta_ci95'][1]:+.4f}], token shuffling "
            f"{shuffle['delta']:+.4f} [{shuffle['delta_ci95'][0]:+.4f}, {shuffle['delta_ci95'][1]:+.4f}]. "
            f"{audit['verdict']['conditional_execution']}"
        )
    )

# %%
table = tables.mudd_table(mudds)
table = table[table.condition != REFERENCE]
fig = px.bar(
    table,
    x="condition",
    y="delta",
    color="model",
    barmode="group",
    error_y=table.delta_ci95_hi - table.delta,
    error_y_minus=table.delta - table.delta_ci95_lo,
    title=f"MUDDPythia: ΔNLL against {REFERENCE} (95% CI)",
    labels={"delta": f"ΔNLL against {REFERENCE} (nats)"},
)
run.figure(fig, "muddpythia_penalties")
