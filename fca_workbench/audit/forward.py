"""The audit's one forward and its per-token NLL: capture's live run and every frozen replay go through here,
so ``correct`` repeats the arithmetic of the live run it is checked against.

The audit needs each token's NLL, never the logits. A model that steps by layer (``SteppingModel``: every
model the workbench loads) runs its blocks and then its head and softmax a chunk of rows at a time
(``models.head_nll``), so only one chunk of the ``[B, T, vocab]`` logits is held at a time: on the shipped
checkpoints the head and the cross-entropy of whole logits cost about as much as the blocks, and at real sizes
a batch's logits are the largest tensor of a forward. A model without layer stepping gives its logits whole.
"""

import torch

from fca_workbench.adapters.protocol import ControlledModel, SteppingModel, Values, as_coefficients, as_values
from fca_workbench.models import head_nll, next_token_nll


def forward_nll(
    model: ControlledModel, input_ids: torch.Tensor, values: list[Values] | None = None
) -> tuple[torch.Tensor, list[Values]]:
    """``(nll, values)`` of one forward of ``input_ids``: with ``values`` None the live run, the controllers'
    values as they gave them; else the frozen run with those values (no controller executes), returned as given.
    ``nll`` is ``[B, T-1]`` (position t predicts token t+1)."""
    if isinstance(model, SteppingModel):
        given = None if values is None else as_coefficients(values)
        output, used, _ = model.run_blocks(model.embed(input_ids), 0, given)
        return head_nll(model, output, input_ids), (as_values(used) if values is None else values)
    if values is None:
        logits, values = model.capture_run(input_ids)
        return next_token_nll(logits, input_ids), values
    return next_token_nll(model.replay_run(input_ids, values), input_ids), values
