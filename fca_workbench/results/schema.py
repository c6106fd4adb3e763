"""The schemas of the files an audit writes: their names, and ``audit.schema.json`` that every ``audit.json`` is
validated against before it is written or read."""

import functools
from pathlib import Path
from typing import cast

from fca_workbench.files import import_jsonschema, read_json
from fca_workbench.results.conditions import ALL_CONDITIONS, RETAINED

AUDIT_SCHEMA = "fca-audit/1"  # audit.json
AUDIT_MANY_SCHEMA = "fca-audit-many/1"  # audit_many.json


@functools.cache
def audit_json_schema() -> dict:
    """``audit.schema.json`` with its name enums filled from the condition vocabulary (``results/conditions.py``),
    so the schema accepts exactly the conditions and retention profiles the workbench names."""
    schema = cast(dict, read_json(Path(__file__).with_name("audit.schema.json")))
    schema["$defs"]["condition_name"]["enum"] = list(ALL_CONDITIONS)
    schema["$defs"]["retention_name"]["enum"] = list(RETAINED)
    return schema


def validate_audit(audit: dict) -> None:
    """Check an audit against ``audit.schema.json`` (schema ``fca-audit/1``) before anyone relies on it."""
    jsonschema = import_jsonschema()  # slow to import; only needed once per audit
    jsonschema.validate(audit, audit_json_schema())
