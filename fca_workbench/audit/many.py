"""``fca audit-many``: audit independently trained seeds and report every figure as mean ± sd."""

from collections.abc import Sequence
from pathlib import Path
from typing import cast

from fca_workbench.audit.distributed import SINGLE, Ranks
from fca_workbench.audit.run import AuditSettings, check_audit_out, run_audit
from fca_workbench.errors import UserError
from fca_workbench.files import write_json
from fca_workbench.results.layout import AUDIT_MANY_FILE
from fca_workbench.results.outputs import output_folder, refuse_foreign
from fca_workbench.results.schema import AUDIT_MANY_SCHEMA
from fca_workbench.results.seeds import summarise


def audit_names(checkpoints: Sequence[str | Path]) -> list[str]:
    """One distinct folder name per checkpoint for its audit: the checkpoint's folder name, prefixed by
    its parent's where two share it (``a/fg``, ``b/fg`` -> ``a-fg``, ``b-fg``), numbered if still equal."""
    paths = [Path(c).resolve() for c in checkpoints]
    repeated = sorted({str(p) for p in paths if paths.count(p) > 1})
    if repeated:
        raise UserError(f"checkpoint {repeated[0]} is given twice; each seed is one checkpoint")
    names = [p.name for p in paths]
    names = [f"{p.parent.name}-{p.name}" if names.count(p.name) > 1 else p.name for p in paths]
    if len(set(names)) < len(names):
        names = [f"{i}-{name}" for i, name in enumerate(names, 1)]
    return names


def aggregate_audits(
    settings_list: Sequence[AuditSettings], out: str | Path, ranks: Ranks = SINGLE, lock_wait: float = 0.0
) -> dict | None:
    """Audit every checkpoint into ``out/<name>`` (``audit_names``), then ``out/audit_many.json``; every
    output folder is checked before the first audit starts. Under torchrun (``ranks``) every audit is
    distributed and rank 0 alone writes the summary and returns it (the other ranks return None)."""
    out = output_folder(out)
    refuse_foreign(out / AUDIT_MANY_FILE, AUDIT_MANY_SCHEMA)
    names = audit_names([settings.checkpoint for settings in settings_list])
    for name in names:
        check_audit_out(out / name)
    runs = [run_audit(settings, out / name, ranks, lock_wait) for settings, name in zip(settings_list, names)]
    if not ranks.lead:
        return None
    audits = cast(list[dict], runs)  # run_audit returns the audit on rank 0
    summary = {
        "schema": AUDIT_MANY_SCHEMA,
        "checkpoints": [a["model"]["path"] for a in audits],
        "audits": names,
        "archs": [a["model"]["arch"] for a in audits],
        "figures": summarise(audits),
    }
    write_json(out / AUDIT_MANY_FILE, summary)
    return summary
