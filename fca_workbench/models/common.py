"""The coefficient seam shared by every model family.

Every family's forward is ``model(input_ids, coefficients=None, return_coefficients=False, labels=None)``.
When ``coefficients`` is given, each layer uses exactly that tensor and no controller module runs; this is
what makes frozen-controller replay possible without hooks.
"""

import itertools
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

IGNORE = -100  # cross-entropy's ignore_index: the targets of rows that predict nothing
# logits computed at once by ``head_nll``: on a CPU about what stays in cache between the head and the
# softmax; on an accelerator large enough to keep its matrix units busy, small enough to bound memory
CPU_LOGITS_CHUNK_BYTES, ACCELERATOR_LOGITS_CHUNK_BYTES = 16 * 2**20, 2**30


@dataclass
class CoefficientLMOutput(ModelOutput):
    """Logits plus the per-layer, batch-first coefficient tensors ``[B, T, *slot_shape]``."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    coefficients: list[torch.Tensor] | None = None


def _hook_device(module: nn.Module) -> torch.device | None:
    hook = getattr(module, "_hf_hook", None)
    for one in getattr(hook, "hooks", None) or ([hook] if hook is not None else []):  # a SequentialHook: its hooks
        if getattr(one, "execution_device", None) is not None:
            return torch.device(one.execution_device)
    return None


def execution_device(module: nn.Module, default: torch.device | None = None) -> torch.device:
    """Where ``module`` computes: accelerate's hook's execution device where big-model inference placed it
    (its weights may be on ``meta``, offloaded), else the device of its first weight that holds values, else
    ``default`` (the CPU). The first module (in ``modules()`` order) with either decides."""
    for part in module.modules():
        hooked = _hook_device(part)
        if hooked is not None:
            return hooked
        for tensor in [*part.parameters(recurse=False), *part.buffers(recurse=False)]:
            if tensor.device.type != "meta":
                return tensor.device
    return default or torch.device("cpu")


class PositiveControl(NamedTuple):
    """A copy of a model that really skips work (``positive_control``), and the settings that make it skip,
    recorded beside its figures in ``audit.json`` ``execution.positive_control``."""

    model: "CoefficientModel"
    settings: dict[str, Any]


def index_slot_labels(slot_shape: tuple[int, ...]) -> list[str]:
    """Generic names of a coefficient's flattened slots, ``slot 0`` (or ``slot 0,1`` for a shape of several
    dimensions), for controllers whose slots no family or kind names."""
    if len(slot_shape) == 1:
        return [f"slot {i}" for i in range(slot_shape[0])]
    return ["slot " + ",".join(map(str, index)) for index in itertools.product(*(range(n) for n in slot_shape))]


def check_window(
    input_ids: torch.Tensor,
    context_length: int,
    slot_shapes: list[tuple[int, ...]],
    coefficients: list[torch.Tensor] | None = None,
) -> None:
    """Refuse windows longer than the context and coefficient lists of the wrong shape, loudly (what every
    implementation's ``check_inputs`` checks)."""
    batch, length = input_ids.shape
    if length > context_length:
        raise ValueError(f"window of {length} tokens is longer than the model's context of {context_length}")
    if coefficients is None:
        return
    if len(coefficients) != len(slot_shapes):
        raise ValueError(f"expected coefficients for {len(slot_shapes)} layers, got {len(coefficients)}")
    for layer, (tensor, slot) in enumerate(zip(coefficients, slot_shapes)):
        expected = (batch, length, *slot)
        if tuple(tensor.shape) != expected:
            raise ValueError(f"coefficients of layer {layer} have shape {tuple(tensor.shape)}, expected {expected}")


def next_token_nll(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Per-token next-token cross-entropy in nats, ``[B, T-1]`` (position t predicts token t+1).

    Computed on all ``B * T`` rows of the logits as they lie (class dimension last and contiguous: about
    twice as fast as ``[B, vocab, T-1]`` on CPU), each window's last row ignored, so the ``[:, :-1]`` slice is
    never copied: the copy of ``B * (T-1) * vocab`` floats cost as much as the softmax itself. Row for row
    the same arithmetic as the cross-entropy of the slice (bit-exact)."""
    targets = input_ids.roll(-1, dims=1)
    targets[:, -1] = IGNORE
    rows = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), reduction="none", ignore_index=IGNORE
    )
    return rows.view(input_ids.shape)[:, :-1]


def logits_rows(width: int, vocab: int, device: torch.device) -> int:
    """Rows of logits ``head_nll`` computes at once: as many as the chunk budget holds, but never fewer than
    the head is wide (``width``), since over fewer rows a wide head's matrix product is slower than over the
    whole logits (on two CPU cores a 4096 x 32000 fp32 head takes 1.87 s for 2,048 rows in chunks of 128, 1.51 s
    whole); a narrow one's logits then still fit in cache when the softmax reads them."""
    budget = CPU_LOGITS_CHUNK_BYTES if device.type == "cpu" else ACCELERATOR_LOGITS_CHUNK_BYTES
    return max(width, budget // (4 * vocab))


def head_nll(model: Any, hidden: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``next_token_nll(model.head(hidden), input_ids)`` (within float rounding), the head and the softmax
    run a few thousand rows at a time (``logits_rows``): a narrow head's chunk of logits is still in cache when
    the softmax reads them, and only one chunk of the ``[B, T, vocab]`` logits is held at a time. For runs that need the NLL
    only (the audit's capture and replays, ``audit.forward``), where the head and the NLL of whole logits cost
    about as much as the blocks of a small model and are the largest tensor of a large one. All ``B * T``
    rows as they lie (each window's last row ignored, as in ``next_token_nll``): slicing it off would copy
    ``hidden``, the whole ``[B, T, vocab]`` for a model whose head is the identity (a transformers model
    steps by layer up to its logits, ``adapters.stepping``)."""
    batch, length = input_ids.shape
    states = hidden.reshape(batch * length, *hidden.shape[2:])
    targets = input_ids.roll(-1, dims=1)
    targets[:, -1] = IGNORE
    targets = targets.reshape(-1)
    rows = logits_rows(states.shape[-1], model.config.vocab_size, hidden.device)
    out = torch.empty(len(targets), dtype=torch.float32, device=hidden.device)
    for start in range(0, len(targets), rows):
        logits = model.head(states[start : start + rows])
        chunk = targets[start : start + rows]
        out[start : start + rows] = F.cross_entropy(logits.float(), chunk, reduction="none", ignore_index=IGNORE)
    return out.view(batch, length)[:, :-1].contiguous()


class CoefficientModel(PreTrainedModel):
    """Base class of the workbench's families: the seam's checks and bookkeeping live here once.

    Subclasses provide ``arch``, ``blocks`` (the per-layer modules, each with a ``branches()`` method),
    ``controllers`` (the modules that emit coefficients; empty for Dense), ``coefficient_slot_shapes``,
    ``context_length``, ``latency_baseline``, the layer stepping (``embed`` / ``run_blocks`` / ``head`` /
    ``resume_layer``) and, where their slots have names, ``slot_labels_for``. Through the seam they implement
    the controlled-model protocol (``fca_workbench.adapters.protocol``: ``ControlledModel`` and
    ``SteppingModel``) directly.
    """

    supports_gradient_checkpointing = False
    arch = ""  # the family's name in ``FAMILIES`` and ``audit.json``
    replay_tolerance = 0.0  # the seam uses exactly the given coefficients: ``correct`` replays bit-exactly
    experts_implementation = None  # no mixture of experts

    @property
    def controller_names(self) -> list[str]:
        """The controllers' module paths, as ``named_modules`` spells them."""
        names = {id(module): name for name, module in self.named_modules()}
        return [names[id(module)] for module in self.controllers]

    @property
    def controller_layers(self) -> list[int]:
        """Per controller, the block it sits in: one controller per block, controller i in block i."""
        return list(range(len(self.controllers)))

    def capture_run(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """Logits and per-controller values ``{"coefficient": [B, T, *slot]}`` of one unperturbed forward."""
        out = self(input_ids, return_coefficients=True)
        return out.logits, [{"coefficient": c} for c in out.coefficients]

    def replay_run(self, input_ids: torch.Tensor, values: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """Logits of the frozen forward with each layer's ``values[l]["coefficient"]``; no controller runs."""
        return self(input_ids, coefficients=[v["coefficient"] for v in values]).logits

    def expert_counts(self, index: int, value: dict[str, torch.Tensor]) -> None:
        """Per-expert evaluations of controller ``index``: the native controllers select no experts."""
        return None

    def positive_control(self, calibration_windows: torch.Tensor) -> PositiveControl | None:
        """A copy that really skips work, audited beside the model; None where the family has none."""
        return None

    @classmethod
    def slot_labels_for(cls, slot_shape: tuple[int, ...]) -> list[str]:
        """The family's names of a coefficient's flattened slots (one per entry, in ``flatten`` order)."""
        return index_slot_labels(slot_shape)

    def controller_record(self) -> dict:
        """{}: a workbench family's ``arch`` names its controllers (``ControlledModel.controller_record``)."""
        return {}

    def slot_labels(self, index: int) -> list[str]:
        """Names of controller ``index``'s flattened slots (``audit.json`` ``model.slot_labels``)."""
        return self.slot_labels_for(self.coefficient_slot_shapes[index])

    def block_branches(self, index: int) -> list[nn.Module]:
        """The modules block ``index`` could skip per token (counted by the execution audit)."""
        block: Any = self.blocks[index]  # every native block has ``branches``
        return list(block.branches())

    @property
    def controllers(self) -> list[nn.Module]:
        return []

    @property
    def coefficient_slot_shapes(self) -> list[tuple[int, ...]]:
        return []

    @property
    def coefficient_dtypes(self) -> list[torch.dtype]:
        """The native controllers compute their coefficients in the model's dtype."""
        return [self.dtype] * len(self.controllers)

    @property
    def context_length(self) -> int:
        raise NotImplementedError

    def check_inputs(self, input_ids: torch.Tensor, coefficients: list[torch.Tensor] | None = None) -> None:
        """Refuse windows longer than the context and coefficient lists of the wrong shape, loudly."""
        check_window(input_ids, self.context_length, self.coefficient_slot_shapes, coefficients)

    @property
    def blocks(self) -> list[nn.Module]:
        raise NotImplementedError

    def latency_baseline(self) -> tuple[str, nn.Module]:
        raise NotImplementedError

    def lm_output(
        self,
        logits: torch.Tensor,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None,
        coefficients: list[torch.Tensor],
        return_coefficients: bool,
    ) -> CoefficientLMOutput:
        loss = None
        if labels is not None:
            loss = next_token_nll(logits, labels).mean()
        return CoefficientLMOutput(loss=loss, logits=logits, coefficients=coefficients if return_coefficients else None)
