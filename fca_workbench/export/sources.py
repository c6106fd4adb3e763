"""Where an export's static profile comes from: a finished audit's saved profiles (checked against the
checkpoint's fingerprint and the sha256 its ``audit.json`` records), or the calibration set, estimated with
the audit's own steps (capture, ``conditions.calibration_profiles``)."""

import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.audit.capture import capture, model_fingerprint
from fca_workbench.audit.conditions import calibration_profiles
from fca_workbench.audit.run import AuditSettings, audit_windows, data_summary
from fca_workbench.errors import UserError
from fca_workbench.files import inside_folder
from fca_workbench.results.layout import PROFILES_FILE
from fca_workbench.results.profiles import verified_profiles

CALIBRATION_BATCH = 16  # windows per capture batch: the audit's CPU default


@dataclass
class ProfileSource:
    """One profile, per controller ``[*slot]`` or a scalar, and what the model card says of where it came from:
    the calibration data (``data_summary``), and with an audit its folder, NLL and retention for the profile."""

    name: str
    layers: list[torch.Tensor]
    calibration: dict
    audit: dict | None = None


def audit_profile(model: ControlledModel, profile: str, audit: dict, folder: Path) -> ProfileSource:
    """Profile ``profile`` as the audit in ``folder`` saved it; refused in one line when that audit is of
    another model (its fingerprint differs), saved no profiles, or holds a file it did not write."""
    if audit["model"]["fingerprint"] != model_fingerprint(model):
        raise UserError(
            f"the audit in {folder} is of another model (its fingerprint differs from this checkpoint's); "
            "export with that audit's checkpoint, or --calib"
        )
    recorded = (audit.get("static_profiles") or {}).get("sha256")
    path = inside_folder(folder, PROFILES_FILE, "the export")
    if not path.is_file():
        raise UserError(f"the audit in {folder} has no {PROFILES_FILE} (an audit of a model without a controller)")
    profiles = verified_profiles(path.read_bytes(), recorded, f"{folder}'s {PROFILES_FILE}")
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


def calibration_profile(
    model: ControlledModel, tokenizer: PreTrainedTokenizerBase, settings: AuditSettings, profile: str
) -> ProfileSource:
    """Profile ``profile`` estimated as the audit does: the calibration windows of ``settings`` (``--calib``,
    else the shipped split) captured, then ``calibration_profiles``."""
    path, windows = audit_windows(settings, "calibration", model, tokenizer)
    with tempfile.TemporaryDirectory(prefix="fca-export-calibration-") as folder:
        cache = capture(model, windows, folder, batch_size=CALIBRATION_BATCH, desc="capture calibration")
        profiles = calibration_profiles(cache)
    if profile not in profiles:
        raise UserError(f"profile '{profile}' is for top-k routers; this model's are {', '.join(sorted(profiles))}")
    return ProfileSource(profile, profiles[profile], data_summary(path, windows))


def static_coefficients(source: ProfileSource, slot_shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """Per controller, the one coefficient ``[*slot]`` the profile assigns to every token (float32, as the
    audit replays it); a profile that varies with the position (``layer_position_mean``) is refused: a
    static model has one set of weights for every position."""
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
