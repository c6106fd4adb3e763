"""``fca train``."""

import argparse

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
    if card is None:
        print(f"stopped early; rerun the same command to resume from {args.out}")
    else:
        print(f"saved {args.out}: eval NLL {card['eval_nll']}, coefficient std {card['within_layer_coefficient_std']}")
