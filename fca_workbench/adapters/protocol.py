"""The controlled-model protocol: the one interface the core (capture, replay, metrics, execution, audit,
dashboard) speaks to, whatever the model family.

``ControlledModel`` is what the core needs of every model; ``SteppingModel`` is layer stepping, a separate
capability the core asks for with ``isinstance(model, SteppingModel)`` (prefix reuse, the per-layer sweep).
The native families implement both through their seam (``fca_workbench.models.CoefficientModel``);
``TransformersControlled`` implements both for any ``transformers`` causal LM by replacing controllers'
``forward`` (``frozen``), and the decoder layers before a replay's first one (``adapters.stepping``). Both
protocols are runtime-checkable, and ``load_controlled``'s return type makes the type checker check both
implementations.
"""

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from fca_workbench.models.common import PositiveControl

COEFFICIENT = "coefficient"

Values = dict[str, torch.Tensor]  # one controller's values: ``"coefficient"`` plus the rest of its output


def as_values(items: Iterable[Values | torch.Tensor]) -> list[Values]:
    """Per-controller values from either values dicts or bare coefficient tensors."""
    return [item if isinstance(item, dict) else {COEFFICIENT: item} for item in items]


def as_coefficients(values: Iterable[Values]) -> list[torch.Tensor | Values]:
    """What ``SteppingModel.run_blocks`` is given: each controller's coefficient where its value holds nothing
    else, its whole values where they hold more (a router's output, to be replayed exactly)."""
    return [value[COEFFICIENT] if value.keys() == {COEFFICIENT} else value for value in values]


@runtime_checkable
class ControlledModel(Protocol):
    """A ``torch.nn.Module`` (``parameters``, ``eval``; calling it runs the live model) with controllers.

    Entry i of every per-controller list belongs to controller i."""

    @property
    def arch(self) -> str:
        """The family (``audit.json`` ``model.arch``): a native family's name or a transformers ``model_type``."""
        ...

    @property
    def config(self) -> Any:
        """The model's configuration (a transformers ``PretrainedConfig``)."""
        ...

    @property
    def controllers(self) -> list[nn.Module]:
        """The controller modules."""
        ...

    @property
    def controller_names(self) -> list[str]:
        """The controllers' module paths (``audit.json`` ``model.controllers``)."""
        ...

    @property
    def controller_layers(self) -> list[int]:
        """Per controller, the index of the decoder layer (``blocks``) it sits in (``audit.json``
        ``model.controller_layers``): one controller per layer in the workbench's families (i → i), several in
        one layer for a foreign model with more than one (a router and a shared-expert gate, a looped layer's
        calls); 0 for a controller outside every decoder layer. What "layer" means in every per-layer figure."""
        ...

    @property
    def coefficient_slot_shapes(self) -> list[tuple[int, ...]]:
        """Per controller, the shape of one token's coefficient (FeatureGate ``[2, G]``, MUDDPythia
        ``[C, i+2]``, a router's dense gate ``[E]``)."""
        ...

    @property
    def coefficient_dtypes(self) -> list[torch.dtype]:
        """Per controller, the dtype its coefficient comes in (a router's gate may be float32 in a bfloat16
        model): what replayed coefficients, static profiles too, are cast to, so replay is exact."""
        ...

    @property
    def context_length(self) -> int:
        """The longest window the model takes."""
        ...

    @property
    def replay_tolerance(self) -> float:
        """The most (nats, per token) the frozen replay of ``correct`` may differ from the live run: 0.0 where
        the family promises bit-exact replay (the controllers' outputs go back through the same arithmetic).
        Every audit checks it (``audit.guard.check_correct_replay``) and records it in ``audit.json``."""
        ...

    @property
    def experts_implementation(self) -> str | None:
        """The kernel a mixture of experts runs its experts through, in capture and replay alike (transformers'
        ``experts_implementation``, ``audit.json`` ``execution.experts``); None without such experts."""
        ...

    @property
    def blocks(self) -> list[nn.Module]:
        """The per-layer modules, counted by the execution audit."""
        ...

    def block_branches(self, index: int) -> list[nn.Module]:
        """The modules block ``index`` could skip per token; [] where only whole blocks are counted."""
        ...

    def capture_run(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[Values]]:
        """``(logits, values)`` of one unperturbed forward; ``values[i]`` holds batch-first tensors
        ``[B, T, ...]``: ``"coefficient"`` (what statistics and static profiles use) plus whatever else the
        controller's output holds (a router's whole output), so that replaying them is exact."""
        ...

    def replay_run(self, input_ids: torch.Tensor, values: list[Values]) -> torch.Tensor:
        """Logits of the frozen forward, no controller executed. A value holding only ``"coefficient"`` (a
        static profile) is turned into an output by the controller's kind."""
        ...

    def check_inputs(self, input_ids: torch.Tensor, coefficients: list[torch.Tensor] | None = None) -> None:
        """Raise ValueError for a window longer than the context or coefficients of the wrong shape."""
        ...

    def expert_counts(self, index: int, value: Values) -> torch.Tensor | None:
        """Evaluations per expert in controller ``index``'s ``value`` (routers), else None."""
        ...

    def latency_baseline(self) -> tuple[str, nn.Module]:
        """What the execution audit times the model against: its name (``execution.baseline``) and a module
        whose call takes ``input_ids`` (a shape-matched Dense, the static mixture of a router model)."""
        ...

    def positive_control(self, calibration_windows: torch.Tensor) -> PositiveControl | None:
        """A copy that really skips work and the settings that make it skip, or None."""
        ...

    def slot_labels(self, index: int) -> list[str]:
        """Names of controller ``index``'s flattened slots, as its family or controller kind declares them
        (``audit.json`` ``model.slot_labels``)."""
        ...

    def controller_record(self) -> dict:
        """What ``audit.json``'s ``model`` says of how the controllers were found: a foreign model's controller
        kind per controller and the input-dependent computation it does not replay (``controller_kinds``,
        ``left_out``); {} for a workbench family, whose ``arch`` names its controllers."""
        ...

    def parameters(self, recurse: bool = True) -> Iterator[nn.Parameter]: ...

    def eval(self) -> Any: ...

    def to(self, *args: Any, **kwargs: Any) -> Any: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


@runtime_checkable
class SteppingModel(Protocol):
    """Layer stepping (``fca_workbench.audit.prefix``): ``embed`` gives the state before layer 0, ``run_blocks``
    continues from the state before any layer, ``head`` turns its output into logits, and ``resume_layer(l)``
    is the first layer whose input state a change of ``coefficients[l]`` can alter.

    ``run_blocks``'s ``coefficients`` (None: controllers live) is ``as_coefficients`` of per-controller values:
    a model whose values are coefficients alone (the native families) is only ever given tensors; it returns
    ``(output, used, states)``: the input of ``head``, what the controllers from ``start`` on used (tensors
    or values) and, with ``keep_states``, the states before layers ``start ..`` through the last."""

    def embed(self, input_ids: torch.Tensor) -> Any: ...

    def run_blocks(
        self, state: Any, start: int, coefficients: Any = None, keep_states: bool = False
    ) -> tuple[torch.Tensor, list[Any], list[Any] | None]: ...

    def head(self, h: torch.Tensor) -> torch.Tensor: ...

    def resume_layer(self, layer: int) -> int: ...


@contextlib.contextmanager
def frozen(replacements: dict[nn.Module, Callable[..., Any]]) -> Iterator[None]:
    """Install ``replacements[module]`` as each module's ``forward`` on the instance, so calling the module
    returns what the replacement returns and the module's own forward never runs (a forward hook could
    not do that: the module would still run). The previous forwards are put back on exit, also when an
    exception escapes."""
    saved = []
    try:
        for module, forward in replacements.items():
            saved.append((module, module.__dict__.get("forward")))
            module.forward = forward  # an instance attribute shadows the method
        yield
    finally:
        for module, previous in reversed(saved):
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
