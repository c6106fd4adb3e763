"""Where an export's static profile comes from: a finished audit's saved profiles (checked against the
checkpoint's fingerprint and the sha256 its ``audit.json`` records), or the calibration set, estimated by the
replay session exactly as the audit estimates it."""

from dataclasses import dataclass
from pathlib import Path

import torch

from fca_workbench.audit.assignment import Profiles, static_profile_values
from fca_workbench.audit.inputs import CALIBRATION
from fca_workbench.audit.session import ReplaySession
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import inside_folder
from fca_workbench.results.binding import audit_binding
from fca_workbench.results.conditions import condition_named
from fca_workbench.results.layout import PROFILES_FILE
from fca_workbench.results.profiles import verified_profiles


@dataclass
class ProfileSource:
    """One static condition, per controller its coefficient ``[*slot]`` at every position, and what the model card
    says of where it came from: the calibration data (``data_summary``), and with an audit its folder, NLL and
    retention for the profile."""

    name: str
    layers: list[torch.Tensor]
    calibration: dict
    audit: dict | None = None


def audit_profiles(session: ReplaySession, audit: dict, folder: Path, instead: str) -> Profiles:
    """The static profiles the audit in ``folder`` saved; refused in one line when that audit is of another
    model (its fingerprint differs; ``instead`` says what to do), saved no profiles, or holds a file it did not
    write."""
    if audit["model"]["fingerprint"] != session.fingerprint:
        raise UserError(
            f"the audit in {folder} is of another model (its fingerprint differs from this checkpoint's); {instead}"
        )
    recorded = (audit.get("static_profiles") or {}).get("sha256")
    path = inside_folder(folder, PROFILES_FILE, "the export")
    if not path.is_file():
        raise UserError(f"the audit in {folder} has no {PROFILES_FILE} (an audit of a model without a controller)")
    expected = audit_binding(audit, ["calibration"])  # its model: this checkpoint's, as just checked
    return verified_profiles(
        path.read_bytes(), recorded, f"{folder}'s {PROFILES_FILE}", expected, "this checkpoint and its audit.json"
    )


def audit_profile(session: ReplaySession, profile: str, audit: dict, folder: Path) -> ProfileSource:
    """Profile ``profile`` as the audit in ``folder`` saved it (``audit_profiles``)."""
    profiles = audit_profiles(session, audit, folder, "export with that audit's checkpoint, or --calib")
    if condition_named(profile).built_in and profile not in profiles:
        raise UserError(f"the audit in {folder} saved no '{profile}' profile (it has {', '.join(sorted(profiles))})")
    condition = audit["conditions"].get(profile, {})
    retention = audit["retention"].get(profile)
    return ProfileSource(
        profile,
        profile_coefficients(session, profile, profiles),
        audit["data"]["calibration"],
        {"folder": str(folder.resolve()), "nll": condition.get("nll"), "retention": retention},
    )


def calibration_profile(session: ReplaySession, profile: str) -> ProfileSource:
    """Profile ``profile`` estimated as the audit does, from the session's calibration windows (``--calib``,
    else the shipped split)."""
    return ProfileSource(
        profile, profile_coefficients(session, profile, session.profiles), session.data_summary(CALIBRATION)
    )


def profile_coefficients(session: ReplaySession, profile: str, profiles: Profiles) -> list[torch.Tensor]:
    """Per controller, the one coefficient ``[*slot]`` static condition ``profile`` assigns to every token, built
    from ``profiles`` as the audit replays it (``assignment.static_profile_values``: a registered static condition
    too), float32; one that varies with the position is refused: a static model has one set of weights for
    every position."""
    slot_shapes = [tuple(s) for s in session.model.coefficient_slot_shapes]
    return [value.float() for value in static_profile_values(profile, profiles, slot_shapes)]
