"""What an artifact was made from: every file an audit, ``fca eval`` or ``fca export`` writes is bound to the
model and the windows it came from, and every reader refuses, in one line, one bound to others.

A binding is ``{"model": <model fingerprint>, "data": {<split>: <windows fingerprint>, ...}}`` (``binding``):
the model's ``audit.capture.model_fingerprint`` and ``files.fingerprint_tensor`` of each set of windows the
artifact was computed from. The JSON files record these fingerprints in fields of their own, read here as
their binding: ``audit.json`` its ``model.fingerprint`` and ``data.<split>.fingerprint`` (``audit_binding``),
``downstream.json`` its ``model.fingerprint`` and ``calibration.fingerprint`` (``downstream_binding``). The
other files carry the binding in their own metadata under ``BINDING_KEY``, as ``binding_text`` writes it:
``static_profiles.safetensors`` (the model and the calibration windows) and the per-token files (the model,
the eval and the calibration windows). ``check_binding`` is the one comparison every reader makes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import canonical_json, parse_json, schema_problem
from fca_workbench.results.layout import AUDIT_FILE
from fca_workbench.results.schema import read_audit_json

BINDING_KEY = "fca_binding"  # the metadata entry of a safetensors or Parquet file, the gzip comment of a CSV
AUDIT_SPLITS = ("eval", "calibration")
RERUN_AUDIT = "rerun fca audit to write it again"
SHOWN_DIGITS = 12  # of a fingerprint in a message

FINGERPRINT = {"type": "string", "pattern": "^[0-9a-f]{64}$"}  # a sha256, as every fingerprint is
BINDING_SCHEMA = {
    "type": "object",
    "required": ["model", "data"],
    "additionalProperties": False,
    "properties": {"model": FINGERPRINT, "data": {"type": "object", "additionalProperties": FINGERPRINT}},
}


def binding(model: str, data: Mapping[str, str | None] | None = None) -> dict:
    """The binding of an artifact: the fingerprint of the model it came from and, per split, of the windows
    (None: the fingerprint is not known, and nothing checked against it passes)."""
    return {"model": model, "data": dict(sorted((data or {}).items()))}


def audit_binding(audit: dict, splits: Iterable[str] = AUDIT_SPLITS) -> dict:
    """The binding ``audit.json`` records: its model's fingerprint and the fingerprints of the windows of
    ``splits`` (``eval``, ``calibration``; none: the model alone)."""
    return binding(audit["model"]["fingerprint"], {split: audit["data"][split].get("fingerprint") for split in splits})


def downstream_binding(downstream: dict) -> dict:
    """The binding ``downstream.json`` (checked ``fca-downstream/1``) records: the model ``fca eval`` evaluated
    and the calibration windows its static profiles came from."""
    return binding(downstream["model"]["fingerprint"], {"calibration": downstream["calibration"].get("fingerprint")})


def binding_text(bound: dict) -> str:
    """A binding as a file's metadata holds it: canonical JSON, so the same binding is always the same text."""
    return canonical_json(bound)


def parse_binding(text: str | bytes | None, source: str) -> dict | None:
    """The binding ``binding_text`` wrote into the metadata of ``source``; None when it records none (a file
    written before artifacts were bound); anything else is one line."""
    if text is None:
        return None
    value = parse_json(text, f"the {BINDING_KEY} metadata of {source}")
    problem = schema_problem(value, BINDING_SCHEMA)
    if problem:
        raise UserError(f"{source} records a {BINDING_KEY} that is not a binding ({problem})")
    return value  # type: ignore[return-value]  # an object: checked just above


def check_binding(found: dict | None, expected: dict, what: str, against: str, advice: str) -> None:
    """Refuse ``what`` (an artifact, named as the user knows it) unless the binding it records (``found``;
    None: it records none) names the model of ``expected`` and, for every split ``expected`` names, the same
    windows. One line: which fingerprint differs and where ``expected`` comes from (``against``), then what
    to do (``advice``)."""
    if found is None:
        raise UserError(
            f"{what} records no fingerprints of the model and data it came from (written before they were "
            f"recorded); {advice}"
        )
    if found["model"] != expected["model"]:
        raise UserError(
            f"{what} is of another model: its model fingerprint {_short(found['model'])} is not "
            f"{_short(expected['model'])} of {against}; {advice}"
        )
    for split, fingerprint in expected["data"].items():
        recorded = found["data"].get(split)
        if fingerprint is None:
            raise UserError(f"{against} records no fingerprint of its {split} windows to check {what} by; {advice}")
        if recorded is None:
            raise UserError(f"{what} records no fingerprint of its {split} windows; {advice}")
        if recorded != fingerprint:
            raise UserError(
                f"{what} is of other {split} windows: their fingerprint {_short(recorded)} is not "
                f"{_short(fingerprint)} of {against}; {advice}"
            )


def check_folder_binding(folder: str | Path, model: str) -> None:
    """Before any work, refuse writing results of the model with fingerprint ``model`` into ``folder`` when it
    holds the ``audit.json`` of another model (they would be read as that model's), in one line; a folder
    without an ``audit.json`` passes."""
    path = Path(folder) / AUDIT_FILE
    if not path.is_file():
        return
    audit, _ = read_audit_json(path)
    check_binding(
        audit_binding(audit, ()), binding(model), f"the audit in {folder}", "this checkpoint", "choose another --out"
    )


def _short(fingerprint: str) -> str:
    return fingerprint[:SHOWN_DIGITS]
