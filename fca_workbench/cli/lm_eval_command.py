"""``fca lm-eval``: lm-eval's own command line with ``--model fca`` registered (``downstream.harness``); run once
``require_lm_eval`` found lm-eval, so a missing ``eval`` extra is one line."""

import argparse

from fca_workbench.cli.quiet import quiet_transformers
from fca_workbench.downstream.harness import run_lm_eval


def cmd_lm_eval(args: argparse.Namespace) -> None:
    quiet_transformers()
    for path in run_lm_eval(args.lm_eval_args):
        print(f"wrote {path}")
