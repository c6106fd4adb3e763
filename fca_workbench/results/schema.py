"""The schemas of the files an audit writes: their names, and ``audit.schema.json`` that every ``audit.json`` is
validated against before it is written (``validate_audit``) or read (``read_audit_json``)."""

import functools
import reprlib
from pathlib import Path
from typing import cast

from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import import_jsonschema, read_json, schema_problem
from fca_workbench.results.conditions import NAME_PATTERN
from fca_workbench.results.layout import AUDIT_FILE

AUDIT_SCHEMA = "fca-audit/1"  # audit.json
AUDIT_MANY_SCHEMA = "fca-audit-many/1"  # audit_many.json


@functools.cache
def audit_json_schema() -> dict:
    """``audit.schema.json`` with its names' pattern filled from the condition registry (``results/conditions.py``):
    a registered condition is written under its own name, and read by a process that never registered it."""
    schema = cast(dict, read_json(Path(__file__).with_name("audit.schema.json")))
    for name in ("condition_name", "retention_name"):
        schema["$defs"][name]["pattern"] = f"^{NAME_PATTERN}$"
    return schema


def validate_audit(audit: dict) -> None:
    """Check an audit against ``audit.schema.json`` (schema ``fca-audit/1``) before anyone relies on it."""
    jsonschema = import_jsonschema()  # slow to import; only needed once per audit
    jsonschema.validate(audit, audit_json_schema())


def read_audit_json(path: str | Path) -> tuple[dict, Path]:
    """The audit dict and its folder; a missing, truncated or foreign file is a one-line ``UserError``."""
    path = Path(path)
    if path.is_dir():
        path = path / AUDIT_FILE
    if not path.is_file():
        raise UserError(f"no {AUDIT_FILE} in {path.parent}" if path.name == AUDIT_FILE else f"not found: {path}")
    try:
        audit = read_json(path, expect=None)
    except UserError as exc:
        raise UserError(f"not a complete {AUDIT_FILE}: {exc}") from None
    if not isinstance(audit, dict) or audit.get("schema") != AUDIT_SCHEMA:
        found = reprlib.repr(audit.get("schema")) if isinstance(audit, dict) else type(audit).__name__
        raise UserError(f"{path} is not an FCA audit (schema {found}, expected {AUDIT_SCHEMA!r})")
    problem = schema_problem(audit, audit_json_schema())
    if problem:
        raise UserError(f"{path} is not a valid FCA audit ({problem})")
    return audit, path.parent
