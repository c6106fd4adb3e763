"""What a condition answers with: the logits of the live model (``correct``) or of the frozen model fed a
static profile of the calibration set, the same profile and the same replay the audit uses."""

import torch

from fca_workbench.adapters.protocol import COEFFICIENT, ControlledModel
from fca_workbench.audit.conditions import Profiles, profile_of, values_on
from fca_workbench.audit.interventions import broadcast_profile
from fca_workbench.errors import UserError
from fca_workbench.results.conditions import ALL_CONDITIONS, PROFILE_CONDITIONS

EVAL_CONDITIONS = ("correct", *PROFILE_CONDITIONS)  # static ones only: a task's text has no cached coefficients
REFERENCES = ("correct", "global_mean")  # the two ends of the gap a retention is measured on


def eval_conditions(asked: list[str], has_controller: bool) -> list[str]:
    """The conditions to evaluate, ``REFERENCES`` first, then the others asked for in order; a condition that
    is not static, or any but ``correct`` for a model without a controller, is one line."""
    for condition in asked:
        if condition not in EVAL_CONDITIONS:
            why = "is not a condition" if condition not in ALL_CONDITIONS else "needs a text's own cached values"
            raise UserError(
                f"--conditions: '{condition}' {why}; fca eval takes the static ones: {', '.join(EVAL_CONDITIONS)}"
            )
    if not has_controller:
        if set(asked) - {"correct"}:
            raise UserError("the model has no controller the workbench can audit: only --conditions correct")
        return ["correct"]
    return list(dict.fromkeys([*REFERENCES, *asked]))


class ConditionLogits:
    """Logits ``[B, T, V]`` of token ids under one condition: ``correct`` runs the live model; a static profile
    runs ``replay_run`` with the profile broadcast over every position (``interventions.broadcast_profile``)."""

    def __init__(self, model: ControlledModel, condition: str, profiles: Profiles | None) -> None:
        self.model, self.condition = model, condition
        try:
            self.profile = None if condition == "correct" else profile_of(condition, profiles)
        except ValueError as exc:
            raise UserError(f"--conditions {condition}: {exc}") from None
        self.dtype = next(model.parameters()).dtype

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        if self.profile is None:
            return self.model(input_ids).logits
        batch, length = input_ids.shape
        coefficients = broadcast_profile(self.profile, self.model.coefficient_slot_shapes, batch, length)
        values = values_on([{COEFFICIENT: c} for c in coefficients], input_ids.device, self.dtype)
        return self.model.replay_run(input_ids, values)
