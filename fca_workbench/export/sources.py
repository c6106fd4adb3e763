"""Where an export's static profile comes from: a finished audit's saved profiles (checked against the
checkpoint's fingerprint and the sha256 its ``audit.json`` records), or the calibration set, estimated by the
replay session exactly as the audit estimates it."""

from dataclasses import dataclass
from pathlib import Path

import torch

from fca_workbench.audit.inputs import CALIBRATION
from fca_workbench.audit.session import ReplaySession
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import inside_folder
from fca_workbench.results.binding import audit_binding
from fca_workbench.results.layout import PROFILES_FILE
from fca_workbench.results.profiles import verified_profiles


@dataclass
class ProfileSource:
    """One profile, per controller ``[*slot]`` or a scalar, and what the model card says of where it came from:
    the calibration data (``data_summary``), and with an audit its folder, NLL and retention for the profile."""

    name: str
    layers: list[torch.Tensor]
    calibration: dict
    audit: dict | None = None


def audit_profile(session: ReplaySession, profile: str, audit: dict, folder: Path) -> ProfileSource:
    """Profile ``profile`` as the audit in ``folder`` saved it; refused in one line when that audit is of
    another model (its fingerprint differs), saved no profiles, or holds a file it did not write."""
    if audit["model"]["fingerprint"] != session.fingerprint:
        raise UserError(
            f"the audit in {folder} is of another model (its fingerprint differs from this checkpoint's); "
            "export with that audit's checkpoint, or --calib"
        )
    recorded = (audit.get("static_profiles") or {}).get("sha256")
    path = inside_folder(folder, PROFILES_FILE, "the export")
    if not path.is_file():
        raise UserError(f"the audit in {folder} has no {PROFILES_FILE} (an audit of a model without a controller)")
    expected = audit_binding(audit, ["calibration"])  # its model: this checkpoint's, as just checked
    profiles = verified_profiles(
        path.read_bytes(), recorded, f"{folder}'s {PROFILES_FILE}", expected, "this checkpoint and its audit.json"
    )
    if profile not in profiles:
        raise UserError(f"the audit in {folder} saved no '{profile}' profile (it has {', '.join(sorted(profiles))})")
    condition = audit["conditions"].get(profile, {})
    retention = audit["retention"].get(profile)
    return ProfileSource(
        profile,
        profiles[profile],
        audit["data"]["calibration"],
        {"folder": str(folder.resolve()), "nll": condition.get("nll"), "retention": retention},
    )


def calibration_profile(session: ReplaySession, profile: str) -> ProfileSource:
    """Profile ``profile`` estimated as the audit does, from the session's calibration windows (``--calib``,
    else the shipped split)."""
    return ProfileSource(profile, session.profiles[profile], session.data_summary(CALIBRATION))


def static_coefficients(source: ProfileSource, slot_shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """Per controller, the one coefficient ``[*slot]`` the profile assigns to every token (float32, as the
    audit replays it); a profile that varies with the position is refused (``export_static`` refuses its name
    before any work): a static model has one set of weights for every position."""
    if len(source.layers) != len(slot_shapes):
        raise UserError(
            f"the '{source.name}' profile has {len(source.layers)} layers, the model {len(slot_shapes)} controllers"
        )
    out = []
    for value, slot in zip(source.layers, slot_shapes):
        if value.dim() > len(slot):
            raise UserError(
                f"profile '{source.name}' depends on the position; a static model has one set of weights for "
                "every position: export global_mean, layer_scalar, layer_mean or layer_mean_topk"
            )
        out.append(value.float().expand(*slot).clone())
    return out
