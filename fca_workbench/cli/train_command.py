"""``fca train``."""

import argparse
import sys
from pathlib import Path

from fca_workbench.adapters.placement import check_device
from fca_workbench.cli.flag_settings import train_settings
from fca_workbench.cli.quiet import quiet_transformers
from fca_workbench.training.hf_config import read_hf_config, read_init_config
from fca_workbench.training.train import TrainSettings, train


def cmd_train(args: argparse.Namespace, settings: TrainSettings | None = None) -> None:
    """Train with ``settings`` (None with ``--hf-config`` or ``--init``: built here, once its config is read)."""
    quiet_transformers()
    check_device(args.device)
    if settings is None:
        fields = read_init_config(args.init) if args.init else read_hf_config(args.hf_config)
        settings = train_settings(args, fields)
    card = train(settings, args.out, stop_after=args.stop_after)
    warning = settings.warmup_warning()  # said of a run that trained, so a refusal stays its one line
    if warning is not None:
        print(f"fca: warning: {warning}", file=sys.stderr)
    if card is None:
        print(f"stopped early; rerun the same command to resume from {args.out}")
    else:
        print(finished_line(args.out, card))


def finished_line(out: str | Path, card: dict) -> str:
    """What a finished run reports: its eval NLL and, where the model has controller coefficients, their spread;
    where it has none to measure, what is true instead (never a bare None)."""
    std = card["within_layer_coefficient_std"]
    if std is not None:
        spread = f"coefficient std {std}"
    elif card["settings"]["hf_config"] is not None:
        spread = "no coefficient std for a transformers model (fca audit finds and measures its controllers)"
    else:
        spread = f"no controller coefficients ({card['arch']} has no controller)"
    return f"saved {out}: eval NLL {card['eval_nll']}, {spread}"
