"""``fca audit-many``: audit independently trained seeds and report every figure as mean ± sd."""

from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import cast

from fca_workbench.adapters.placement import check_device
from fca_workbench.audit.cache_lock import folder_lock
from fca_workbench.audit.distributed import SINGLE, Ranks
from fca_workbench.audit.run import AuditSettings, check_audit_out, run_audit
from fca_workbench.foundation.checkpoint import checkpoint_name, hub_name
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import read_json, write_json
from fca_workbench.foundation.flags import Shard
from fca_workbench.results.layout import AUDIT_FILE, AUDIT_MANY_FILE
from fca_workbench.results.outputs import check_output, mark_output, output_folder, refuse_foreign
from fca_workbench.results.schema import AUDIT_MANY_SCHEMA
from fca_workbench.results.seeds import retention_summary, summarise
from fca_workbench.results.shards import check_shards, shard_plan, write_shard_record

MANY_COMMAND = "fca audit-many"  # what an audit-many folder's marker names


def audit_names(checkpoints: Sequence[str | Path]) -> list[str]:
    """One distinct folder name per checkpoint for its audit: the checkpoint's folder name (``org--name`` for a
    hub name), prefixed by its parent's where two folders share it (``a/fg``, ``b/fg`` -> ``a-fg``, ``b-fg``),
    numbered if still equal."""
    keys = [str(c) if hub_name(c) else str(Path(c).resolve()) for c in checkpoints]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise UserError(f"checkpoint {repeated[0]} is given twice; each seed is one checkpoint")
    names = [checkpoint_name(c) for c in checkpoints]
    names = [
        f"{Path(key).parent.name}-{name}" if names.count(name) > 1 and not hub_name(c) else name
        for c, key, name in zip(checkpoints, keys, names)
    ]
    if len(set(names)) < len(names):
        names = [f"{i}-{name}" for i, name in enumerate(names, 1)]
    return names


def aggregate_audits(
    settings_list: Sequence[AuditSettings],
    out: str | Path,
    ranks: Ranks = SINGLE,
    lock_wait: float = 0.0,
    shard: Shard | None = None,
) -> dict | None:
    """Audit every checkpoint into ``out/<name>`` (``audit_names``), then ``out/audit_many.json``; every
    output folder is checked before the first audit starts, and ``out`` is locked while they run.
    Under torchrun (``ranks``) every audit is distributed and rank 0 alone writes the summary and returns it
    (the other ranks return None). With ``shard``, only that shard's audits run (each audit folder locked on
    its own, so the shards of one ``out`` run at once) and a shard record takes the summary's place;
    ``assemble_audits`` writes the summary once every shard has finished."""
    out = output_folder(out)
    refuse_foreign(out / AUDIT_MANY_FILE, AUDIT_MANY_SCHEMA)
    names = audit_names([settings.checkpoint for settings in settings_list])
    ours = {*names, AUDIT_MANY_FILE}  # an earlier version's folder: its audits and summary, unmarked
    check_output(out, MANY_COMMAND, adopt=lambda folder: all(p.name in ours for p in folder.iterdir()))
    planned = list(zip(settings_list, names))
    todo = shard.take(planned) if shard else planned
    for _, name in todo:
        check_audit_out(out / name)
    for device in {settings.device for settings, _ in todo}:
        check_device(device)  # before the lock makes the folder
    lock = folder_lock(out, "output folder", lock_wait, ranks) if shard is None else nullcontext()
    with lock:
        if ranks.lead:
            mark_output(out, MANY_COMMAND)
        runs = [run_audit(settings, out / name, ranks, lock_wait) for settings, name in todo]
    if not ranks.lead:
        return None
    if shard is not None:
        write_shard_record(out, shard, many_plan(settings_list, names))
        return None
    return write_summary(out, names, cast(list[dict], runs))  # run_audit returns the audit on rank 0


def assemble_audits(settings_list: Sequence[AuditSettings], out: str | Path) -> dict:
    """``out/audit_many.json`` from the audits every ``--shard K/N`` of the same command wrote into ``out``
    (each shard's record checked against this command's plan first)."""
    out = output_folder(out)
    names = audit_names([settings.checkpoint for settings in settings_list])
    check_shards(out, many_plan(settings_list, names))
    audits = [cast(dict, read_json(out / name / AUDIT_FILE)) for name in names]
    return write_summary(out, names, audits)


def many_plan(settings_list: Sequence[AuditSettings], names: Sequence[str]) -> dict:
    """The plan every shard of one ``fca audit-many`` agrees on (``results.shards``)."""
    return shard_plan(MANY_COMMAND, ((name, s.without_paths()) for s, name in zip(settings_list, names)))


def write_summary(out: Path, names: Sequence[str], audits: list[dict]) -> dict:
    """``out/audit_many.json``: every figure of the audits as mean ± sd over the seeds, each
    retention as a ratio of means with its bootstrap CI over seeds."""
    summary = {
        "schema": AUDIT_MANY_SCHEMA,
        "checkpoints": [a["model"]["path"] for a in audits],
        "audits": list(names),
        "archs": [a["model"]["arch"] for a in audits],
        "figures": summarise(audits),
        "retention": retention_summary(audits),
    }
    write_json(out / AUDIT_MANY_FILE, summary)
    return summary
