"""The schemas of the files an audit writes: their names, and ``audit.schema.json`` that every ``audit.json`` is
validated against before it is written or read."""

import json
from pathlib import Path

from fca_workbench.files import import_jsonschema

AUDIT_SCHEMA = "fca-audit/1"  # audit.json
AUDIT_MANY_SCHEMA = "fca-audit-many/1"  # audit_many.json


def validate_audit(audit: dict) -> None:
    """Check an audit against ``audit.schema.json`` (schema ``fca-audit/1``) before anyone relies on it."""
    jsonschema = import_jsonschema()  # slow to import; only needed once per audit

    schema = json.loads((Path(__file__).with_name("audit.schema.json")).read_text())
    jsonschema.validate(audit, schema)
