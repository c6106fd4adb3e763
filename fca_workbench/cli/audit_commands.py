"""``fca audit`` and ``fca audit-many``: the two commands that also run under torchrun."""

import argparse
from pathlib import Path

from fca_workbench.audit.distributed import process_group
from fca_workbench.audit.many import aggregate_audits
from fca_workbench.audit.run import default_out, run_audit
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.cli.quiet import quiet_transformers
from fca_workbench.results.layout import AUDIT_FILE, AUDIT_MANY_FILE, PER_TOKEN_CSV
from fca_workbench.results.report import format_report
from fca_workbench.results.seeds import format_aggregate


def cmd_audit(args: argparse.Namespace, settings: AuditSettings) -> None:
    quiet_transformers()
    out = Path(args.out) if args.out else default_out(args.checkpoint)
    with process_group(args.device) as ranks:  # under torchrun: this rank among the others
        audit = run_audit(settings, out, ranks, args.lock_wait)
    if audit is not None:  # rank 0 alone reports
        print(format_report(audit))
        print(f"\nwrote {out / AUDIT_FILE} and {out / PER_TOKEN_CSV}")


def cmd_audit_many(args: argparse.Namespace, settings: list[AuditSettings]) -> None:
    quiet_transformers()
    out = Path(args.out) if args.out else Path("results") / "audit-many"
    with process_group(args.device) as ranks:
        summary = aggregate_audits(settings, out, ranks, args.lock_wait)
    if summary is not None:
        print(format_aggregate(summary))
        print(f"\nwrote {out / AUDIT_MANY_FILE}")
