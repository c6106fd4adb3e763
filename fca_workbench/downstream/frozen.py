"""What a condition answers with on a task's text: the logits a replay session gives for it, the live model's
for the reference, the frozen model's fed a static profile of the calibration set for a static condition."""

import torch

from fca_workbench.audit.session import ReplaySession
from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import LOW, REFERENCE, condition_named


def eval_conditions(asked: list[str] | None, session: ReplaySession) -> list[str]:
    """The conditions to evaluate, ``REFERENCE`` and ``LOW`` first, then the others asked for in order (static
    ones, ``settings.EvalSettings`` checks; None: every static one the model replays), then the retention
    reference a condition asked for declares (a router's top-k profile: ``random_topk``) where the model replays
    it; one this model does not replay (a router's for a model without routers), or any but the reference for a
    model without a controller, is one line."""
    if not session.has_controller:
        if set(asked or ()) - {REFERENCE}:
            raise UserError(f"the model has no controller the workbench can audit: only --conditions {REFERENCE}")
        return [REFERENCE]
    if asked is None:
        asked = [c for c in session.conditions if condition_named(c).static]
    references = [r for c in asked if (r := condition_named(c).reference) is not None and r in session.conditions]
    chosen = list(dict.fromkeys([REFERENCE, LOW, *asked, *references]))
    for condition in chosen:
        session.check_condition(condition, "--conditions")
    return chosen


class ConditionLogits:
    """Logits ``[B, T, V]`` of token ids under one condition (``ReplaySession.logits``); a static condition's
    profile is estimated (or refused) here, before any text is read."""

    def __init__(self, session: ReplaySession, condition: str) -> None:
        self.session, self.condition = session, condition
        named = condition_named(condition)
        if named.static and named.built_in and condition not in session.profiles:
            raise UserError(f"--conditions {condition}: the calibration capture gave no '{condition}' profile")

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.session.logits(self.condition, input_ids)
