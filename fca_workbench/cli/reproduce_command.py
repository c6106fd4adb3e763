"""``fca reproduce``."""

import argparse
import sys

from fca_workbench.cli.quiet import quiet_transformers
from fca_workbench.notebooks.reproduce import reproduce, reproduce_shard
from fca_workbench.results.layout import INDEX_FILE


def cmd_reproduce(args: argparse.Namespace) -> int:
    quiet_transformers()
    if args.shard is not None:
        record = reproduce_shard(args.config, args.out, args.shard)
        print(f"wrote shard {args.shard}'s audits ({record}); once every shard has finished, assemble with --assemble")
        return 0
    plan, results = reproduce(args.config, args.out, overwrite=args.overwrite, assemble=args.assemble)
    failed = [r for r in results if not r.ok]
    for r in results:
        print(
            f"{'passed' if r.ok else 'FAILED'}  {r.name:20s} {r.seconds:6.1f} s" + (f"  {r.error}" if r.error else "")
        )
    print(f"\nwrote {plan.out} (index: {plan.out / INDEX_FILE})")
    if failed:
        print(
            f"fca: {len(failed)} of {len(results)} notebooks failed: {', '.join(r.name for r in failed)}",
            file=sys.stderr,
        )
        return 1
    return 0
