"""``fca data prepare`` and ``fca data checkpoints``."""

import argparse
from pathlib import Path

from fca_workbench.cli.quiet import quiet_transformers
from fca_workbench.data.corpus import prepare_corpus
from fca_workbench.foundation.resources import CHECKPOINTS_ENV, copy_checkpoints


def cmd_data_prepare(args: argparse.Namespace) -> None:
    quiet_transformers()
    summary = prepare_corpus(Path(args.sdist) if args.sdist else None, args.vocab_size)
    for split, info in summary.items():
        print(f"{split:12s} {len(info['works']):3d} works {info['tokens']:>9,} tokens  sha256 {info['sha256'][:16]}")


def cmd_data_checkpoints(args: argparse.Namespace) -> None:
    names = copy_checkpoints(args.source, Path(args.into))
    print(
        f"copied {len(names)} checkpoints ({', '.join(names)}) to {args.into}; "
        f"fca reproduce and fca dashboard use them with {CHECKPOINTS_ENV}={Path(args.into).resolve()}"
    )
