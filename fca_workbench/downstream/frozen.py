"""What a condition answers with: the logits of the live model (``correct``) or of the frozen model fed a
static profile of the calibration set, the same profile and the same replay the audit uses."""

import torch

from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.audit.conditions import Profiles, profile_of, static_values, values_on
from fca_workbench.downstream.settings import LOW, REFERENCE
from fca_workbench.errors import UserError


def eval_conditions(asked: list[str], has_controller: bool) -> list[str]:
    """The conditions to evaluate, ``REFERENCE`` and ``LOW`` first, then the others asked for in order (static ones,
    ``settings.EvalSettings`` checks); any but ``correct`` for a model without a controller is one line."""
    if not has_controller:
        if set(asked) - {REFERENCE}:
            raise UserError(f"the model has no controller the workbench can audit: only --conditions {REFERENCE}")
        return [REFERENCE]
    return list(dict.fromkeys([REFERENCE, LOW, *asked]))


class ConditionLogits:
    """Logits ``[B, T, V]`` of token ids under one condition: ``correct`` runs the live model; a static profile
    runs ``replay_run`` with the profile broadcast over every position (``conditions.static_values``)."""

    def __init__(self, model: ControlledModel, condition: str, profiles: Profiles | None) -> None:
        self.model, self.condition, self.profiles = model, condition, profiles
        if condition != REFERENCE:
            try:
                profile_of(condition, profiles)  # refused here, before any text is read
            except ValueError as exc:
                raise UserError(f"--conditions {condition}: {exc}") from None
        self.dtype = next(model.parameters()).dtype

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        if self.condition == REFERENCE:
            return self.model(input_ids).logits
        values = static_values(self.condition, self.profiles, self.model.coefficient_slot_shapes, *input_ids.shape)
        return self.model.replay_run(input_ids, values_on(values, input_ids.device, self.dtype))
