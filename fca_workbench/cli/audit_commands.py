"""``fca audit`` and ``fca audit-many``: the two commands that also run under torchrun."""

import argparse
from pathlib import Path

from fca_workbench.audit.distributed import process_group
from fca_workbench.audit.many import aggregate_audits, assemble_audits
from fca_workbench.audit.run import default_out, run_audit
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.cli.quiet import quiet_transformers
from fca_workbench.results.layout import AUDIT_FILE, AUDIT_MANY_FILE, PER_TOKEN_CSV, cache_root
from fca_workbench.results.report import format_report
from fca_workbench.results.seeds import format_aggregate


def cmd_audit(args: argparse.Namespace, settings: AuditSettings) -> None:
    quiet_transformers()
    out = Path(args.out) if args.out else default_out(args.checkpoint)
    with process_group(args.device) as ranks:  # under torchrun: this rank among the others
        audit = run_audit(settings, out, ranks, args.lock_wait, capture_only=args.capture_only)
    if args.capture_only and ranks.lead:
        print(f"captured into {cache_root(settings.cache, out)}; replay with the same command without --capture-only")
    if audit is not None:  # rank 0 alone reports
        print(format_report(audit))
        print(f"\nwrote {out / AUDIT_FILE} and {out / PER_TOKEN_CSV}")


def cmd_audit_many(args: argparse.Namespace, settings: list[AuditSettings]) -> None:
    quiet_transformers()
    out = Path(args.out) if args.out else Path("results") / "audit-many"
    if args.assemble:
        summary: dict | None = assemble_audits(settings, out)
    else:
        with process_group(args.device) as ranks:
            summary = aggregate_audits(settings, out, ranks, args.lock_wait, args.shard)
        if args.shard is not None and ranks.lead:
            print(f"wrote shard {args.shard} into {out}; once every shard has finished, assemble with --assemble")
    if summary is not None:
        print(format_aggregate(summary))
        print(f"\nwrote {out / AUDIT_MANY_FILE}")
