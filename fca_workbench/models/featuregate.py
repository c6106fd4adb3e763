"""FeatureGate: the Dense Transformer plus one controller per block that gates channel groups.

For block l with input h (per token): ``a = 2·sigmoid(W_l · rmsnorm(h) + b_l)`` reshaped to ``[2, G]``;
``a[0]`` gates the attention branch and ``a[1]`` the MLP branch, each group covering ``d/G`` channels.
``W_l, b_l`` start at zero, so every gate starts at 1 and the untrained model equals Dense.

Two config fields vary that design (the controller-design study, ``studies/controller_design.py``):
``gate_range`` (``GATE_RANGES``: ``2sigmoid`` as above, ``sigmoid`` in (0, 1), whose gates start at 0.5,
``1+tanh`` in (0, 2)) and ``gate_input`` (``GATE_INPUTS``: ``normed`` as above, ``raw``: the residual ``h``
itself, ``detached``: ``rmsnorm(h)`` cut from the graph, so no gradient reaches the hidden state through
the controller).

``skip_threshold`` turns the model into the audit's positive control: tokens whose MLP gates all fall
below it skip the MLP branch (gather/scatter), so the execution audit has a real saving to find.
"""

import copy
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fca_workbench.models.common import CoefficientLMOutput, PositiveControl, execution_device
from fca_workbench.models.dense import Block, DenseConfig, GPTBackbone

BRANCHES = ("attn", "mlp")  # what the two rows of a layer's gates ``[2, G]`` gate

# The gate as a function of the controller's logits; each is 1 at logit 0 except ``sigmoid`` (0.5).
GATE_RANGES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "2sigmoid": lambda logits: 2 * torch.sigmoid(logits),
    "sigmoid": torch.sigmoid,
    "1+tanh": lambda logits: 1 + torch.tanh(logits),
}
GATE_INPUTS = ("normed", "raw", "detached")  # what the controller reads of the block input h


class FeatureGateConfig(DenseConfig):
    model_type = "fca-featuregate"

    def __init__(
        self,
        gate_groups: int | None = None,
        skip_threshold: float | None = None,
        gate_range: str = "2sigmoid",
        gate_input: str = "normed",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.gate_groups = gate_groups or self.n_head
        if self.n_embd % self.gate_groups:
            raise ValueError(f"n_embd={self.n_embd} is not divisible by gate_groups={self.gate_groups}")
        if gate_range not in GATE_RANGES:
            raise ValueError(f"gate_range={gate_range!r}: choose from {', '.join(GATE_RANGES)}")
        if gate_input not in GATE_INPUTS:
            raise ValueError(f"gate_input={gate_input!r}: choose from {', '.join(GATE_INPUTS)}")
        self.skip_threshold = skip_threshold
        self.gate_range = gate_range
        self.gate_input = gate_input

    @classmethod
    def from_sizes(
        cls,
        vocab_size: int,
        layers: int,
        width: int,
        heads: int,
        window: int,
        gate_groups: int | None = None,
        gate_range: str = "2sigmoid",
        gate_input: str = "normed",
    ) -> "FeatureGateConfig":
        return cls(
            vocab_size=vocab_size,
            n_layer=layers,
            n_embd=width,
            n_head=heads,
            block_size=window,
            gate_groups=gate_groups,
            gate_range=gate_range,
            gate_input=gate_input,
        )


class GateController(nn.Module):
    """Reads the block input (as ``gate_input`` says) and emits its gates ``[B, T, 2, G]`` in ``gate_range``."""

    def __init__(self, config: FeatureGateConfig):
        super().__init__()
        self.groups = config.gate_groups
        self.gate = GATE_RANGES[config.gate_range]
        self.input = config.gate_input
        self.proj = nn.Linear(config.n_embd, 2 * config.gate_groups)
        self.proj.init_scale = 0.0  # type: ignore[assignment]  # read by ``_init_weights``: logits start at 0

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.input != "raw":
            h = F.rms_norm(h.detach() if self.input == "detached" else h, (h.shape[-1],))
        return self.gate(self.proj(h)).unflatten(-1, (2, self.groups))


def expand_groups(gate: torch.Tensor, width: int) -> torch.Tensor:
    """Repeat each group's gate over its ``width / G`` channels: ``[..., G] -> [..., width]``."""
    return gate.repeat_interleave(width // gate.shape[-1], dim=-1)


class FeatureGateBlock(Block):
    def __init__(self, config: FeatureGateConfig):
        super().__init__(config)
        self.controller = GateController(config)
        self.config = config  # read at call time, so setting config.skip_threshold takes effect at once

    def forward(self, h: torch.Tensor, gates: torch.Tensor) -> torch.Tensor:  # type: ignore[override]  # gated
        width = h.shape[-1]
        h = h + expand_groups(gates[..., 0, :], width) * self.attn_branch(h)
        return h + self.gated_mlp(h, gates[..., 1, :])

    def gated_mlp(self, h: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        width = h.shape[-1]
        threshold = self.config.skip_threshold
        if threshold is None:
            return expand_groups(gate, width) * self.mlp_branch(h)
        keep = (gate.amax(dim=-1) >= threshold).nonzero(as_tuple=True)
        out = torch.zeros_like(h)
        out[keep] = expand_groups(gate[keep], width) * self.mlp_branch(h[keep])
        return out


class FeatureGateForCausalLM(GPTBackbone):
    config_class = FeatureGateConfig
    block_class = FeatureGateBlock
    arch = "featuregate"

    def positive_control(self, calibration_windows: torch.Tensor) -> PositiveControl:
        """The copy that skips MLP rows below the median gate (``execution.positive_control``), and its
        ``skip_threshold``."""
        control = positive_control(self, calibration_windows, quantile=0.5)
        return PositiveControl(control, {"skip_threshold": control.config.skip_threshold})

    @classmethod
    def slot_labels_for(cls, slot_shape: tuple[int, ...]) -> list[str]:
        """``attn g0`` / ``mlp g0``: the branch a gate scales and its channel group."""
        return [f"{branch} g{g}" for branch in BRANCHES for g in range(slot_shape[1])]

    @property
    def gated_blocks(self) -> list[FeatureGateBlock]:
        return cast(list[FeatureGateBlock], list(self.h))

    @property
    def controllers(self) -> list[nn.Module]:
        return [block.controller for block in self.gated_blocks]

    @property
    def coefficient_slot_shapes(self) -> list[tuple[int, ...]]:
        return [(2, self.config.gate_groups)] * self.config.n_layer

    def block_step(
        self, layer: int, h: torch.Tensor, coefficients: list[torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One gated block for ``run_blocks``: the same ops as one step of ``forward``'s loop."""
        block = self.gated_blocks[layer]
        gates = block.controller(h) if coefficients is None else coefficients[layer]
        return block(h, gates), gates

    def forward(
        self,
        input_ids: torch.Tensor,
        coefficients: list[torch.Tensor] | None = None,
        return_coefficients: bool = False,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> CoefficientLMOutput:
        self.check_inputs(input_ids, coefficients)
        h = self.embed(input_ids)
        used = []
        for layer, block in enumerate(self.gated_blocks):
            gates = block.controller(h) if coefficients is None else coefficients[layer]
            used.append(gates)
            h = block(h, gates)
        return self.lm_output(self.head(h), input_ids, labels, used, return_coefficients)


def positive_control(
    model: "FeatureGateForCausalLM", calibration_windows: torch.Tensor, quantile: float = 0.5, batch_size: int = 16
) -> "FeatureGateForCausalLM":
    """A copy of a FeatureGate that really skips work: tokens whose MLP gates all fall below a threshold
    skip the MLP branch. The threshold is the ``quantile`` of the per-token max MLP gate over the
    calibration windows (one for all layers), so about that fraction of token-MLP evaluations is skipped —
    a known saving the execution audit must find."""
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must lie in [0, 1], got {quantile}")
    model.eval()
    maxima: list[torch.Tensor] = []
    with torch.no_grad():
        for batch in calibration_windows.split(batch_size):
            out = model(batch.to(execution_device(model)), return_coefficients=True)
            maxima.extend(gates[..., 1, :].amax(-1).flatten().float().cpu() for gates in out.coefficients)
    threshold = float(np.quantile(torch.cat(maxima).numpy(), quantile))

    control = copy.deepcopy(model).eval()
    control.config.skip_threshold = threshold  # the blocks read it from the (copied) shared config
    return control
