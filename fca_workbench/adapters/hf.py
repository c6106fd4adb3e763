"""The controlled-model protocol for any ``transformers`` causal LM, from outside the model.

Controllers are found by the kinds of ``fca_workbench.adapters.kinds`` (or named by a regex). Capture
records each controller's whole output with a forward hook; replay replaces each controller's ``forward``
on the instance (``frozen``), so it returns the given values without running. Every controller must run
exactly once per forward (checked), which holds for the MoE families of transformers 5.x.
"""

import contextlib
from typing import Any

import torch
from torch import nn

from fca_workbench.adapters.kinds import KINDS, ControllerKind, tensor_kind
from fca_workbench.adapters.protocol import COEFFICIENT, Values, frozen
from fca_workbench.errors import UserError
from fca_workbench.models.common import PositiveControl, check_window

PROBE_SHAPE = (2, 3)  # the forward that learns the slot shapes and output layouts, and checks the outputs
# the frozen replay's allowance where bit-exactness is not promised: a model class from a checkpoint folder's own
# code (--trust-remote-code), whose experts need not run in transformers' eager loop
REMOTE_CODE_REPLAY_TOLERANCE = 1e-4


def find_controllers(model: nn.Module, pattern: str | None = None) -> list[tuple[str, nn.Module, ControllerKind]]:
    """``[(name, module, kind)]``: the modules a kind claims, or those ``pattern`` names (whole path)."""
    kinds = [tensor_kind(pattern)] if pattern is not None else KINDS
    found = []
    for name, module in model.named_modules():
        kind = next((k for k in kinds if k.find(name, module)), None)
        if kind is not None:
            found.append((name, module, kind))
    if pattern is not None and not found:
        shown = ", ".join(name for name, _ in list(model.named_modules())[1:6])
        raise UserError(f"--controllers '{pattern}' matches no module of this model (its modules: {shown}, ...)")
    return found


class TransformersControlled(nn.Module):
    """A transformers causal LM seen through the protocol (``ControlledModel``; no layer stepping)."""

    def __init__(self, model: nn.Module, controllers: str | None = None):
        super().__init__()
        self.model: Any = model.eval()  # a transformers PreTrainedModel
        set_experts = getattr(self.model, "set_experts_implementation", None)
        if set_experts is not None:
            # eager loops over the experts a token uses: a zero-weight expert contributes exactly nothing,
            # so a static profile equal to the live routing replays bit-exactly (docs/guides/foreign-models.md)
            set_experts("eager")
        own_code = type(self.model).__module__.startswith("transformers.")
        self.replay_tolerance = 0.0 if set_experts is not None and own_code else REMOTE_CODE_REPLAY_TOLERANCE
        found = find_controllers(model, controllers)
        self.controller_names = [name for name, _, _ in found]
        self._controllers = [module for _, module, _ in found]
        self.kinds = [kind for _, _, kind in found]
        self.coefficient_slot_shapes: list[tuple[int, ...]] = []
        # per controller: outputs [B·T, ...] (True) or [B, T, ...] (False)
        self._flat: list[bool | None] = [None] * len(found)
        if found:
            with torch.no_grad():
                _, values = self.capture_run(torch.zeros(PROBE_SHAPE, dtype=torch.long, device=self._device))
            self.coefficient_slot_shapes = [tuple(v[COEFFICIENT].shape[2:]) for v in values]

    @property
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def config(self) -> Any:
        return self.model.config

    @property
    def arch(self) -> str:
        return self.model.config.model_type

    @property
    def controllers(self) -> list[nn.Module]:
        return list(self._controllers)

    @property
    def context_length(self) -> int:
        config = self.model.config
        for field in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            if isinstance(getattr(config, field, None), int):
                return getattr(config, field)
        raise UserError(f"the {self.arch} config names no context length (max_position_embeddings)")

    @property
    def blocks(self) -> list[nn.Module]:
        """The decoder layers: the ModuleList with ``num_hidden_layers`` entries, else none."""
        count = getattr(self.model.config, "num_hidden_layers", None)
        for _, module in self.model.named_modules():
            if isinstance(module, nn.ModuleList) and len(module) == count:
                return list(module)
        return []

    def block_branches(self, index: int) -> list[nn.Module]:
        """None known: a foreign decoder layer says nothing of which submodules it could skip per token."""
        return []

    def slot_labels(self, index: int) -> list[str]:
        return self.kinds[index].slot_labels(self.coefficient_slot_shapes[index])

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        return self.model(input_ids=input_ids, use_cache=False, **kwargs)

    def check_inputs(self, input_ids: torch.Tensor, coefficients: list[torch.Tensor] | None = None) -> None:
        check_window(input_ids, self.context_length, self.coefficient_slot_shapes, coefficients)

    def _once(self, index: int, calls: list[int]) -> None:
        calls[index] += 1
        if calls[index] > 1:
            raise UserError(
                f"controller {self.controller_names[index]} runs more than once per forward; the adapter cannot replay it"
            )

    def capture_run(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[Values]]:
        """Logits and each controller's whole output, batch-first, recorded by forward hooks."""
        batch, length = input_ids.shape
        values: list[Any] = [None] * len(self._controllers)
        calls = [0] * len(self._controllers)

        def record(index):
            def hook(module, args, kwargs, output):
                self._once(index, calls)

                def batch_first(tensor):
                    if self._flat[index] is None:  # the probe: learn the layout
                        self._flat[index] = tuple(tensor.shape[:2]) != (batch, length)
                    lead = self._lead(index, batch, length)
                    if tuple(tensor.shape[: len(lead)]) != lead:
                        raise UserError(
                            f"gives a {tuple(tensor.shape)} output for {batch}×{length} tokens; "
                            "the adapter cannot use it"
                        )
                    return tensor.detach().reshape(batch, length, *tensor.shape[len(lead) :])

                try:
                    values[index] = self.kinds[index].to_values(output, batch_first)
                except UserError as exc:
                    raise UserError(f"controller {self.controller_names[index]} {exc}") from None

            return hook

        with contextlib.ExitStack() as stack:
            for index, module in enumerate(self._controllers):
                stack.callback(module.register_forward_hook(record(index), with_kwargs=True).remove)
            logits = self(input_ids).logits
        missing = [self.controller_names[i] for i, v in enumerate(values) if v is None]
        if missing:
            raise UserError(f"controllers {missing} did not run in a forward; the adapter cannot use them")
        return logits, values

    def _lead(self, index: int, batch: int, length: int) -> tuple[int, ...]:
        """The leading shape of controller ``index``'s outputs for ``batch`` × ``length`` tokens."""
        return (batch * length,) if self._flat[index] else (batch, length)

    def replay_run(self, input_ids: torch.Tensor, values: list[Values]) -> torch.Tensor:
        """Logits with every controller replaced by its values (``frozen``): no controller executes."""
        calls = [0] * len(self._controllers)
        lead = [self._lead(i, *input_ids.shape) for i in range(len(self._controllers))]

        def replacement(index):
            def forward(*args, **kwargs):
                self._once(index, calls)
                return self.kinds[index].to_output(values[index], lead[index])

            return forward

        with frozen({module: replacement(i) for i, module in enumerate(self._controllers)}):
            return self(input_ids).logits

    def expert_counts(self, index: int, value: Values) -> torch.Tensor | None:
        experts = self.kinds[index].experts
        return None if experts is None else experts(value)

    def latency_baseline(self) -> tuple[str, nn.Module]:
        """The static mixture (``StaticMixture``)."""
        return "static_mixture", StaticMixture(self)

    def positive_control(self, calibration_windows: torch.Tensor) -> PositiveControl | None:
        return None


class StaticMixture(nn.Module):
    """The same model with every expert run for every token: each router frozen to a uniform gate over its
    experts, other controllers live (a router model's latency baseline)."""

    def __init__(self, controlled: TransformersControlled):
        super().__init__()
        self.controlled = controlled

    def _uniform(self, index: int, batch: int, length: int) -> Any:
        controlled = self.controlled
        experts = controlled.coefficient_slot_shapes[index][0]
        gate = torch.full((batch, length, experts), 1.0 / experts, device=controlled._device)
        output = controlled.kinds[index].to_output({COEFFICIENT: gate}, controlled._lead(index, batch, length))
        return lambda *args, **kwargs: output

    def forward(self, input_ids: torch.Tensor) -> Any:
        controlled = self.controlled
        routers = [i for i, kind in enumerate(controlled.kinds) if kind.experts is not None]
        with frozen({controlled.controllers[i]: self._uniform(i, *input_ids.shape) for i in routers}):
            return controlled(input_ids)
