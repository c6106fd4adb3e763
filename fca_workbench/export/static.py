"""``export_static``: the checkpoint with one static profile folded into its weights, its tokenizer and a model
card, written as a new folder; every refusal is one line, before anything is written."""

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.audit.inputs import CALIBRATION
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.export.card import CARD_JSON, export_model_card
from fca_workbench.export.experts import FOLDABLE, check_foldable, expert_counts, fold_routers
from fca_workbench.export.native import featuregate_to_gpt2, muddpythia_static
from fca_workbench.export.request import check_request
from fca_workbench.export.sources import ProfileSource, audit_profile, calibration_profile
from fca_workbench.foundation.checkpoint import CARD_FILE, hub_name, resolve_checkpoint
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import atomic_folder, relative_path, write_atomic, write_json
from fca_workbench.results.frames import read_audit_json
from fca_workbench.results.layout import audit_cache_root


def export_static(
    checkpoint: str | Path,
    profile: str,
    out: str | Path,
    *,
    audit: str | Path | None = None,
    calib: str | Path | None = None,
    max_windows: int | None = None,
    seed: int = 0,
) -> Path:
    """Write ``out``: the checkpoint with static profile ``profile`` folded into its weights (``save_pretrained``),
    its tokenizer and a model card; returns ``out``. The profile is the one the audit in ``audit`` saved, else
    estimated from ``calib`` (default: the shipped calibration split; ``max_windows`` of it, spread evenly).
    Every refusal is one line, before anything is written; an ``out`` that holds anything is never touched."""
    out = check_out(out)
    check_request(profile, audit, calib, max_windows)
    audited = read_audit_json(audit) if audit is not None else None
    dtype = audited[0]["settings"]["dtype"] if audited else "float32"
    settings = AuditSettings(
        str(checkpoint),
        calibration=None if calib is None else str(calib),
        max_windows=max_windows,
        seed=seed,
        dtype=dtype,
    )
    resolved = resolve_checkpoint(settings.checkpoint, settings.trust_remote_code)
    with tempfile.TemporaryDirectory(prefix="fca-export-calibration-") as cache:
        memo = audit_cache_root(*audited) if audited else None  # the fingerprint remembered beside the audit's caches
        session = ReplaySession.open(replace(settings, cache=cache), checkpoint=resolved, read_now=(), memo_root=memo)
        model, tokenizer = session.model, session.tokenizer
        family = folding(model, checkpoint)  # before any window is read
        session.windows(CALIBRATION)  # a bad calibration file refused here, before any capture
        session.check_condition(profile, "--profile")  # a live run of one calibration window's first tokens
        source = audit_profile(session, profile, *audited) if audited else calibration_profile(session, profile)
        fingerprint = session.fingerprint
    exported = family.fold(model, source.layers)
    line = command(checkpoint, profile, out, audit, calib, max_windows)
    card = export_card(model, exported, source, resolved.record(relative_to=out), out, seed, line, fingerprint)
    card.update(family.card(model, exported))
    with atomic_folder(out) as folder:
        exported.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        write_json(folder / CARD_JSON, card)
        write_atomic(folder / CARD_FILE, str(export_model_card(card)).encode())
    return out


def check_out(out: str | Path) -> Path:
    """``out``, refused when it is a file or a folder that holds anything: an export writes a new folder."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not an empty folder; fca export writes a new one (nothing written)")
    return out


def nothing_to_check(model: Any) -> None:
    """A native family folds whatever its own checkpoint holds."""


def no_card_facts(model: Any, exported: PreTrainedModel) -> dict:
    return {}


@dataclass(frozen=True)
class Folding:
    """How one family's static profile becomes weights: ``check`` refuses in one line what it cannot fold
    exactly (before any window is read), ``fold`` makes the model, ``card`` adds what the model card reports."""

    fold: Callable[[Any, list[torch.Tensor]], PreTrainedModel]
    check: Callable[[Any], None] = nothing_to_check
    card: Callable[[Any, PreTrainedModel], dict] = no_card_facts


ROUTERS = Folding(fold_routers, check_foldable, lambda model, exported: {"experts": expert_counts(model, exported)})
FOLDINGS: dict[str, Folding] = {  # by ``ControlledModel.arch``; the MoE families from ``Family.experts``
    "featuregate": Folding(featuregate_to_gpt2),
    "muddpythia": Folding(muddpythia_static),
    **dict.fromkeys(FOLDABLE, ROUTERS),
}


def folding(model: ControlledModel, checkpoint: str | Path) -> Folding:
    """The model's family's folding, once ``check`` passed; refused in one line for a model without a
    controller or a family none is declared for."""
    if not model.controllers:
        raise UserError(f"{checkpoint} has no controller: there is nothing to fold")
    declared = FOLDINGS.get(model.arch)
    if declared is None:
        kinds = ", ".join(sorted(set(model.controller_record().get("controller_kinds", [])))) or model.arch
        raise UserError(
            f"fca export folds the controllers of {', '.join(sorted(FOLDINGS))}; a {model.arch} model "
            f"(controllers: {kinds}) is not supported"
        )
    declared.check(model)
    return declared


def command(checkpoint: str | Path, profile: str, out: Path, audit: Any, calib: Any, max_windows: int | None) -> str:
    """The ``fca export`` command line that writes this export again, run from the folder that holds ``out``
    (its paths relative to that folder, a hub name as given)."""
    here = out.resolve().parent

    def shown(path: str | Path) -> str:
        return str(path) if hub_name(path) else relative_path(path, here)

    given = {"--audit": audit, "--calib": calib, "--max-windows": max_windows}
    options = "".join(
        f" {flag} {value if flag == '--max-windows' else relative_path(value, here)}"
        for flag, value in given.items()
        if value is not None
    )
    return f"fca export {shown(checkpoint)} --profile {profile}{options} --out {out.name}"


def export_card(
    model: ControlledModel,
    exported: Any,
    source: ProfileSource,
    record: dict,
    out: Path,
    seed: int,
    line: str,
    fingerprint: str,
) -> dict:
    """The model card's facts: the source checkpoint (``Checkpoint.record`` from ``out``), profile, calibration
    data and the audit's figures for it, every path relative to ``out``."""
    calibration = {**source.calibration, "source": relative_path(source.calibration["source"], out)}
    audit = source.audit and {**source.audit, "folder": relative_path(source.audit["folder"], out)}
    card = {
        "source": {
            **record,
            "arch": model.arch,
            "fingerprint": fingerprint,
            "params": sum(p.numel() for p in model.parameters()),
        },
        "profile": source.name,
        "calibration": calibration,
        "audit": audit,
        "model_type": exported.config.model_type,
        "params": sum(p.numel() for p in exported.parameters()),
        "seed": seed,
        "command": line,
    }
    return card
