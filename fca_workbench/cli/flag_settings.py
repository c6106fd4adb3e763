"""Each command's settings, built from its parsed flags once and checked before torch is imported: a flag that
is out of range, names an unknown dtype, profile or condition, or contradicts another is refused in a blink.

A settings field takes the flag of its own name (``--max-windows`` → ``max_windows``); the few flags spelled
otherwise are declared here.
"""

import argparse
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from fca_workbench.audit.settings import AuditSettings
from fca_workbench.downstream.eval_settings import EvalSettings, comma_names
from fca_workbench.export.request import check_request
from fca_workbench.foundation.errors import UserError
from fca_workbench.training.train_settings import TrainSettings
from fca_workbench.viewmodel.serving import ServedSettings, serving_auth

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Settings = TypeVar("Settings", bound=DataclassInstance)
else:
    Settings = TypeVar("Settings")

AUDIT_FLAGS = {"calibration": "calib"}  # AuditSettings field -> its flag, where the two are spelled differently
TRAIN_FLAGS = {"train_data": "train"}  # the same for TrainSettings
SHAPE_FLAGS = ("layers", "width", "heads", "gate_groups", "gate_range", "gate_input")  # they shape --arch models


def from_flags(kind: type[Settings], args: argparse.Namespace, spelled: Mapping[str, str], **fixed: Any) -> Settings:
    """A ``kind`` dataclass from the flags: each field from its flag (``spelled`` names those spelled otherwise),
    left to its default where the command has no such flag or it was not given (None); ``fixed`` as given."""
    given = vars(args)
    flags = {field.name: spelled.get(field.name, field.name) for field in dataclasses.fields(kind)}
    values = {name: given[flag] for name, flag in flags.items() if given.get(flag) is not None}
    return kind(**{**values, **fixed})


def audit_settings(args: argparse.Namespace, checkpoint: str) -> AuditSettings:
    """The audit of ``checkpoint`` as ``fca audit``, ``fca audit-many`` or ``fca eval`` flags ask for it."""
    return from_flags(AuditSettings, args, AUDIT_FLAGS, checkpoint=checkpoint)


def audits_settings(args: argparse.Namespace) -> list[AuditSettings]:
    """``fca audit-many``: one audit per checkpoint, with the same flags."""
    return [audit_settings(args, checkpoint) for checkpoint in args.checkpoints]


def eval_settings(args: argparse.Namespace) -> EvalSettings:
    return EvalSettings(
        audit_settings(args, args.checkpoint), comma_names(args.tasks), comma_names(args.conditions), args.limit
    )


def train_settings(args: argparse.Namespace, hf_config: dict | None = None) -> TrainSettings:
    """``fca train``'s settings; ``hf_config``: the fields of its ``--hf-config`` file (``train.read_hf_config``)."""
    return from_flags(TrainSettings, args, TRAIN_FLAGS, hf_config=hf_config)


def arch_train_settings(args: argparse.Namespace) -> TrainSettings | None:
    """``fca train``'s flags checked; with ``--arch`` its settings, with ``--hf-config`` or ``--init`` None: those
    need the config file read by transformers, so the command builds them."""
    shape = [name for name in SHAPE_FLAGS if getattr(args, name) is not None]
    if args.arch is None and shape:
        named = ", ".join(f"--{name.replace('_', '-')}" for name in shape)
        raise UserError(f"{named} shape --arch models; a --hf-config file or an --init checkpoint sets its own sizes")
    return None if args.arch is None else train_settings(args)


def check_export_flags(args: argparse.Namespace) -> None:
    """``fca export``'s profile and its source (``export.request``)."""
    check_request(args.profile, args.audit, args.calib, args.max_windows)


@dataclass(frozen=True)
class DashboardServing:
    """What ``fca dashboard`` serves and how it authenticates."""

    settings: ServedSettings
    auth: dict  # Panel's basic_auth and cookie_secret options (serving.serving_auth)


def dashboard_serving(args: argparse.Namespace) -> DashboardServing:
    return DashboardServing(ServedSettings.from_args(args), serving_auth(args))
