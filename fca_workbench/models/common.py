"""The coefficient seam shared by every model family.

Every family's forward is ``model(input_ids, coefficients=None, return_coefficients=False, labels=None)``.
When ``coefficients`` is given, each layer uses exactly that tensor and no controller module runs; this is
what makes frozen-controller replay possible without hooks.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput


@dataclass
class CoefficientLMOutput(ModelOutput):
    """Logits plus the per-layer, batch-first coefficient tensors ``[B, T, *slot_shape]``."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    coefficients: list[torch.Tensor] | None = None


def next_token_nll(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-token next-token cross-entropy in nats, ``[B, T-1]`` (position t predicts token t+1).

    Computed on rows ``[B * (T-1), vocab]``: the class dimension last and contiguous is about twice as fast
    as ``[B, vocab, T-1]`` on CPU, where the log-softmax would stride over the vocabulary."""
    shifted = logits[:, :-1].float()
    return F.cross_entropy(
        shifted.reshape(-1, shifted.shape[-1]), input_ids[:, 1:].reshape(-1), reduction="none"
    ).view(shifted.shape[:2])


class CoefficientModel(PreTrainedModel):
    """Base class of the workbench's families: the seam's checks and bookkeeping live here once.

    Subclasses provide ``arch``, ``blocks`` (the per-layer modules), ``controllers`` (the modules that emit
    coefficients; empty for Dense), ``coefficient_slot_shapes`` and ``context_length``. Through the seam
    they implement the controlled-model protocol (``fca_workbench.adapters.protocol``) directly.
    """

    supports_gradient_checkpointing = False
    arch = ""  # the family's name in ``FAMILIES`` and ``audit.json``
    supports_stepping = True  # embed / run_blocks / head / resume_layer

    @property
    def controller_names(self) -> list[str]:
        """The controllers' module paths, as ``named_modules`` spells them."""
        names = {id(module): name for name, module in self.named_modules()}
        return [names[id(module)] for module in self.controllers]

    def capture_run(self, input_ids: torch.Tensor):
        """Logits and per-controller values ``{"coefficient": [B, T, *slot]}`` of one unperturbed forward."""
        out = self(input_ids, return_coefficients=True)
        return out.logits, [{"coefficient": c} for c in out.coefficients]

    def replay_run(self, input_ids: torch.Tensor, values) -> torch.Tensor:
        """Logits of the frozen forward with each layer's ``values[l]["coefficient"]``; no controller runs."""
        return self(input_ids, coefficients=[v["coefficient"] for v in values]).logits

    def expert_counts(self, index: int, value) -> None:
        """Per-expert evaluations of controller ``index``: the native controllers select no experts."""
        return None

    def latency_baseline(self):
        """What latency is compared with: a shape-matched Dense with random weights (``execution``)."""
        from ..execution import shape_matched_dense

        return "dense", shape_matched_dense(self)

    def positive_control(self, calibration_windows: torch.Tensor):
        """A copy that really skips work, audited beside the model; None where the family has none."""
        return None

    @property
    def controllers(self) -> list[nn.Module]:
        return []

    @property
    def coefficient_slot_shapes(self) -> list[tuple[int, ...]]:
        return []

    @property
    def context_length(self) -> int:
        raise NotImplementedError

    def check_inputs(self, input_ids: torch.Tensor, coefficients) -> None:
        """Refuse windows longer than the context and coefficient lists of the wrong shape, loudly."""
        batch, length = input_ids.shape
        if length > self.context_length:
            raise ValueError(
                f"window of {length} tokens is longer than the model's context of {self.context_length}"
            )
        if coefficients is None:
            return
        shapes = self.coefficient_slot_shapes
        if len(coefficients) != len(shapes):
            raise ValueError(f"expected coefficients for {len(shapes)} layers, got {len(coefficients)}")
        for layer, (tensor, slot) in enumerate(zip(coefficients, shapes)):
            expected = (batch, length, *slot)
            if tuple(tensor.shape) != expected:
                raise ValueError(
                    f"coefficients of layer {layer} have shape {tuple(tensor.shape)}, expected {expected}"
                )

    def lm_output(self, logits, input_ids, labels, coefficients, return_coefficients) -> CoefficientLMOutput:
        loss = None
        if labels is not None:
            loss = next_token_nll(logits, labels).mean()
        return CoefficientLMOutput(
            loss=loss, logits=logits, coefficients=coefficients if return_coefficients else None
        )
