"""``fca export``."""

import argparse

from fca_workbench.cli.quiet import quiet_transformers
from fca_workbench.export.static import export_static
from fca_workbench.foundation.checkpoint import CARD_FILE


def cmd_export(args: argparse.Namespace) -> None:
    quiet_transformers()
    out = export_static(
        args.checkpoint,
        args.profile,
        args.out,
        audit=args.audit,
        calib=args.calib,
        max_windows=args.max_windows,
        seed=args.seed,
    )
    print(f"wrote {out}: {args.checkpoint} with its '{args.profile}' profile folded in (model card: {out / CARD_FILE})")
