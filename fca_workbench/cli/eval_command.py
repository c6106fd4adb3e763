"""``fca eval`` (also under torchrun): run once ``require_lm_eval`` found lm-eval (the command table asks it first, so a missing
``eval`` extra is one line, not an ImportError from this module's imports)."""

import argparse
from pathlib import Path

from fca_workbench.audit.distributed import process_group
from fca_workbench.audit.run import default_out
from fca_workbench.cli.quiet import quiet_transformers
from fca_workbench.downstream.eval_settings import EvalSettings
from fca_workbench.downstream.evaluation import run_eval
from fca_workbench.downstream.table import format_downstream
from fca_workbench.results.layout import DOWNSTREAM_FILE


def cmd_eval(args: argparse.Namespace, settings: EvalSettings) -> None:
    quiet_transformers()
    out = Path(args.out) if args.out else default_out(args.checkpoint)
    with process_group(settings.audit.device) as ranks:  # under torchrun: the documents shared among the ranks
        downstream = run_eval(settings, out, ranks)
    if downstream is not None:  # rank 0 alone reports
        print(format_downstream(downstream))
        print(f"\nwrote {out / DOWNSTREAM_FILE}")
