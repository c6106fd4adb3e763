"""Work split over nodes (``--shard K/N`` of ``fca audit-many`` and ``fca reproduce``): each shard records
what it finished, and the assembly checks every record before it writes the summary, index or notebooks.

A record names its command and the whole plan it took its share of: the audits' folder names, in the plan's
order, and their settings (paths aside: nodes may mount them differently, as ``run.check_ranks`` has it).
The assembly recomputes the plan from its own command line, so a shard run with other checkpoints, flags or
shard count, or one not finished, is refused in one line before anything is written.
"""

from collections.abc import Iterable
from pathlib import Path
from typing import cast

from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import dumps_json, parse_json, read_json, write_json
from fca_workbench.foundation.flags import Shard
from fca_workbench.results.layout import SHARDS_DIR, shard_record_file

SHARD_SCHEMA = "fca-shard/1"


def shard_plan(command: str, work: Iterable[tuple[str, dict]]) -> dict:
    """What every shard of one run agrees on: ``command`` and ``work``, each audit's folder name and settings
    in the plan's order, as JSON holds them (so a record read back compares equal)."""
    items = [{"audit": name, "settings": settings} for name, settings in work]
    return cast(dict, parse_json(dumps_json({"command": command, "work": items}), "a shard plan"))


def write_shard_record(out: Path, shard: Shard, plan: dict) -> Path:
    """``out/shards/K-of-N.json``, once every audit of the shard is written."""
    path = out / SHARDS_DIR / shard_record_file(*shard)
    done = [item["audit"] for item in shard.take(plan["work"])]
    write_json(path, {"schema": SHARD_SCHEMA, "shard": list(shard), **plan, "done": done})
    return path


def check_shards(out: Path, plan: dict) -> None:
    """Every shard of ``plan`` finished into ``out``, with this plan; else one line naming the first record
    (or shard) that is missing or mismatched."""
    folder = out / SHARDS_DIR
    records = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not records:
        raise UserError(f"{out} holds no finished shard ({SHARDS_DIR}/ is empty); run each --shard K/N first")
    counts = set()
    for path in records:
        record = cast(dict, read_json(path))
        shard = record.get("shard")
        if record.get("schema") != SHARD_SCHEMA or not isinstance(shard, list) or len(shard) != 2:
            raise UserError(f"{path} is not a shard record fca wrote; remove it")
        if {k: record.get(k) for k in plan} != plan:
            differs = next(k for k in plan if record.get(k) != plan[k])
            raise UserError(f"shard {shard[0]}/{shard[1]} ({path}) ran another plan (its {differs} differs)")
        counts.add(shard[1])
    if len(counts) > 1:
        raise UserError(f"{folder} holds shards of runs split {' and '.join(map(str, sorted(counts)))} ways")
    count = counts.pop()
    missing = [k for k in range(count) if not (folder / shard_record_file(k, count)).is_file()]
    if missing:
        raise UserError(f"shard {missing[0]}/{count} has not finished into {out} ({len(missing)} of {count} missing)")
