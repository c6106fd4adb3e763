"""The controlled-model protocol for any ``transformers`` causal LM, from outside the model.

Controllers are found by the kinds of ``fca_workbench.adapters.kinds``, MoE routers by role
(``fca_workbench.adapters.routers``) and selective SSMs and gates by the roles of
``fca_workbench.adapters.selective``, plus (or, with ``only_controllers``, instead) those a regex names.
Capture records each controller's whole output with a forward hook; replay replaces each controller's
``forward`` on the instance (``frozen``), so it returns the given values without running (a ``ColumnKind``'s
projection runs and its control columns are overwritten; a logits-only router's routing step is recorded and
replaced with it). A module that runs several times per forward (a gate in a looped layer: HRM's cycles,
Dory's recurrent loop) is one controller per call, ``NAME@callK`` for its K-th call (``per_call``), each
fed its own values on replay; a module that runs more times than counted is refused in one line.
"""

import contextlib
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from fca_workbench.adapters.classification import check_classified_kinds, classification_note
from fca_workbench.adapters.families import family_of
from fca_workbench.adapters.gate_probe import learned_indexers, probed_controllers
from fca_workbench.adapters.kinds import KINDS, ControllerKind, tensor_kind
from fca_workbench.adapters.patterns import MAX_PATH, safe_pattern
from fca_workbench.adapters.protocol import COEFFICIENT, Values, frozen
from fca_workbench.adapters.routers import find_routers, split_routing_step, unclaimed_routers
from fca_workbench.adapters.selective import ColumnKind, Found, selective_controllers
from fca_workbench.adapters.stepping import LayerStepping, call_order, controller_layers, once_through, separate_head
from fca_workbench.foundation.errors import UserError
from fca_workbench.models.common import PositiveControl, check_window, execution_device

PROBE_SHAPE = (2, 3)  # the forward that learns the slot shapes and output layouts, and checks the outputs
# the frozen replay's allowance where bit-exactness is not promised: a model class from a checkpoint folder's own
# code (--trust-remote-code), whose experts need not run in transformers' eager loop
REMOTE_CODE_REPLAY_TOLERANCE = 1e-4
UNBOUNDED_CONTEXT = 1 << 20  # the "context" of a recurrent model whose config names none: any window it is given
CALL = "@call"  # a looped controller's K-th call in a forward is the controller ``NAME@callK``


def find_controllers(model: nn.Module, controllers: str | None = None, only_controllers: str | None = None) -> Any:
    """``[(name, module, kind)]`` in module order (``discover_controllers`` without what it leaves out)."""
    return discover_controllers(model, controllers, only_controllers)[0]


def discover_controllers(
    model: nn.Module, controllers: str | None = None, only_controllers: str | None = None
) -> tuple[list[tuple[str, nn.Module, ControllerKind]], list[str]]:
    """``([(name, module, kind)], left out)``: in module order, the modules the built-in kinds and roles
    claim (MoE routers, ``fca_workbench.adapters.selective``) and the gates the probe finds
    (``fca_workbench.adapters.gate_probe``), plus those ``controllers`` names; or, with ``only_controllers``,
    those alone. A named module must sit inside a decoder layer. Left out: one line per input-dependent gate
    found that is not replayed."""
    if controllers is not None and only_controllers is not None:
        raise UserError("give --controllers (added to the built-in kinds) or --only-controllers, not both")
    pattern = only_controllers if only_controllers is not None else controllers
    flag = "--only-controllers" if only_controllers is not None else "--controllers"
    found = find_named(model, pattern, flag) if pattern is not None else []
    if only_controllers is None:
        claimed = {id(module) for _, module, _ in found}
        routers = find_routers(model)
        for name, module in model.named_modules():
            kind = next((k for k in KINDS if k.find(name, module)), None) or routers.get(name)
            if kind is not None and id(module) not in claimed:
                found.append((name, module, kind))
                claimed.add(id(module))
        found += [entry for entry in selective_controllers(model) if id(entry[1]) not in claimed]
        unclaimed = unclaimed_routers(model, [name for name, _, _ in found])
        if unclaimed:
            raise UserError(
                f"{unclaimed[0]} ({type(model.get_submodule(unclaimed[0])).__name__}) looks like a router that no "
                "controller kind handles; the adapter cannot audit this model (docs/guides/foreign-models.md)"
            )
    probe = torch.arange(PROBE_SHAPE[0] * PROBE_SHAPE[1], device=execution_device(model)).view(PROBE_SHAPE)
    probed, left_out = probed_controllers(model, probe, [name for name, _, _ in found], only_controllers is None)
    found += probed
    left_out += learned_indexers(model, [name for name, _, _ in found])
    if only_controllers is None:
        check_classified_kinds(getattr(model.config, "model_type", ""), [kind.name for _, _, kind in found])
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}  # a ParameterGate: beside its owner
    ordered = sorted(found, key=lambda entry: order.get(entry[0], order.get(entry[0].rpartition(".")[0], -1) + 0.5))
    return ordered, left_out


def per_call(found: Found, calls: dict[int, int]) -> Found:
    """``found`` with each module that ``calls`` (by ``id``) counts running several times per forward made one
    controller per call, ``NAME@call0``, ``NAME@call1``, ... in call order, where the module's entry was: each
    call's coefficients are cached, profiled and swept as a controller of their own."""
    return [
        (f"{name}{CALL}{call}" if calls[id(module)] > 1 else name, module, kind)
        for name, module, kind in found
        for call in range(max(1, calls[id(module)]))
    ]


def find_named(model: nn.Module, pattern: str, flag: str) -> list[tuple[str, nn.Module, ControllerKind]]:
    """The modules inside the decoder layers whose whole path ``pattern`` matches (``safe_pattern``)."""
    kind = tensor_kind(safe_pattern(pattern, flag))
    found = [
        (name, module, kind)
        for name, module in model.named_modules()
        if len(name) <= MAX_PATH and kind.find(name, module)
    ]
    if not found:
        shown = ", ".join(name for name, _ in list(model.named_modules())[1:6])
        raise UserError(f"{flag} '{pattern}' matches no module of this model (its modules: {shown}, ...)")
    layers = decoder_layers(model)
    if not layers:
        raise UserError(
            f"{flag}: this model's decoder layers are not found, so where a controller sits cannot be checked"
        )
    inside = {id(m) for block in layers for m in block.modules()}
    outside = [name for name, module, _ in found if id(module) not in inside]
    if outside:
        raise UserError(
            f"{flag} '{pattern}' names {outside[0]}, which is outside the decoder layers; a controller must sit "
            "inside one (not the embeddings, the final norm or the LM head)"
        )
    return found


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers: the ModuleList with as many entries as the config counts layers
    (``num_hidden_layers``, or the field its family declares), else the first ``layers`` ModuleList."""
    config: Any = model.config
    count = getattr(config.get_text_config(), family_of(config).layers or "num_hidden_layers", None)
    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
    for _, module in lists:
        if len(module) == count:
            return list(module)
    return next((list(module) for name, module in lists if name.rpartition(".")[2] == "layers"), [])


class TransformersControlled(LayerStepping, nn.Module):
    """A transformers causal LM seen through the protocol (``ControlledModel``, and ``SteppingModel`` by
    replacing decoder layers with their recorded outputs: ``adapters.stepping``)."""

    def __init__(self, model: nn.Module, controllers: str | None = None, only_controllers: str | None = None):
        super().__init__()
        self.model: Any = model.eval()  # a transformers PreTrainedModel
        experts = getattr(self.model, "get_experts_implementation", None)
        # the experts run as the user's forward runs them (transformers' default, ``grouped_mm``, where the model
        # leaves it unset), in capture and replay alike, so ``correct`` replays the live run bit for bit
        self.experts_implementation: str | None = None if experts is None else experts()[""]
        own_code = type(self.model).__module__.startswith("transformers.")
        self.replay_tolerance = 0.0 if experts is not None and own_code else REMOTE_CODE_REPLAY_TOLERANCE
        found, self.left_out = discover_controllers(model, controllers, only_controllers)
        note = classification_note(self.arch, [kind.name for _, _, kind in found], self.left_out)
        if note is not None:  # the audit goes on: what discovery found is all it has
            print(f"fca: note: {note}", file=sys.stderr)
        self._blocks = decoder_layers(self.model)
        probe = torch.arange(PROBE_SHAPE[0] * PROBE_SHAPE[1], device=self._device).view(PROBE_SHAPE)
        modules = list({id(module): module for _, module, _ in found}.values())
        with torch.no_grad():
            order = call_order([*self._blocks, *modules], lambda: self(probe))
        self.stepping_depth = once_through([i for i in order if i < len(self._blocks)], len(self._blocks))
        found = per_call(found, {id(m): order.count(len(self._blocks) + i) for i, m in enumerate(modules)})
        self.controller_names = [name for name, _, _ in found]
        self.controller_layers = controller_layers(self.model, self._blocks, self.controller_names)
        self._controllers = [module for _, module, _ in found]
        # per controller, the controllers of its module in call order (one, but for a module in a looped layer)
        self._calls = [
            [j for j, other in enumerate(self._controllers) if other is module] for module in self._controllers
        ]
        self.kinds = [kind for _, _, kind in found]
        self._steps = [self._step_owner(name, kind) for name, _, kind in found]
        self.coefficient_slot_shapes: list[tuple[int, ...]] = []
        self.coefficient_dtypes: list[torch.dtype] = []  # as the probe found them (a router's gate: float32)
        # per controller, per output tensor in the order its kind reads them: [B·T, ...] (True) or [B, T, ...]
        self._flat: list[list[bool] | None] = [None] * len(found)
        if found:
            self.coefficient_slot_shapes = self._probe_slot_shapes()
        self.separate_lm_head = separate_head(self, probe)  # [the LM head] where the logits are its output alone

    def _probe_slot_shapes(self) -> list[tuple[int, ...]]:
        """Each controller's slot shape, from probes of two lengths: a coefficient that is not floating point
        (indices) or whose width follows the sequence length (DeepSeek-V3.2's indexer: the top-k of T keys)
        is a one-line error."""
        batch, length = PROBE_SHAPE
        shapes = []
        for probe in ((batch, length), (batch, length + 1)):
            with torch.no_grad():
                _, values = self.capture_run(torch.zeros(probe, dtype=torch.long, device=self._device))
            shapes.append([tuple(v[COEFFICIENT].shape[2:]) for v in values])
        for name, value, short, long in zip(self.controller_names, values, *shapes):
            if short != long:
                raise UserError(
                    f"controller {name} gives {short} per token for {length} tokens and {long} for {length + 1}: "
                    "its width depends on the sequence length; the adapter cannot use it"
                )
            if not value[COEFFICIENT].is_floating_point():
                raise UserError(f"controller {name} gives {value[COEFFICIENT].dtype} values, not coefficients")
        self.coefficient_dtypes = [value[COEFFICIENT].dtype for value in values]
        return shapes[0]

    @property
    def _device(self) -> torch.device:
        return execution_device(self.model)

    @property
    def config(self) -> Any:
        """The text model's config (the config itself but for a multimodal model, whose sizes, vocabulary and
        context are its text config's)."""
        return self.model.config.get_text_config()

    @property
    def arch(self) -> str:
        return self.model.config.model_type

    @property
    def controllers(self) -> list[nn.Module]:
        return list(self._controllers)

    @property
    def context_length(self) -> int:
        """The config's context length; a config that names none (Mamba, Mamba2, xLSTM: recurrent models
        with no position embeddings) takes any window (``UNBOUNDED_CONTEXT``), and the audit's default
        window is then 256 tokens."""
        config = self.config
        for field in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
            if isinstance(getattr(config, field, None), int):
                return getattr(config, field)
        return UNBOUNDED_CONTEXT

    @property
    def blocks(self) -> list[nn.Module]:
        """The decoder layers (``decoder_layers``, found once)."""
        return list(self._blocks)

    def _step_owner(self, name: str, kind: ControllerKind) -> tuple[nn.Module, str] | None:
        """``(module, attribute)`` of the controller's routing step: an attribute of its parent (given the step
        as a method where its forward computes it inline, ``routers.split_routing_step``)."""
        if kind.step is None:
            return None
        owner = self.model.get_submodule(name.rpartition(".")[0])
        split_routing_step(owner, kind.step)
        if not callable(getattr(owner, kind.step, None)):
            raise UserError(f"controller {name}: its block has no routing step {kind.step}; the adapter cannot use it")
        return owner, kind.step

    def block_branches(self, index: int) -> list[nn.Module]:
        """None known: a foreign decoder layer says nothing of which submodules it could skip per token."""
        return []

    def controller_record(self) -> dict:
        """Each controller's kind and what was found input-dependent and is not replayed, one line each."""
        return {"controller_kinds": [kind.name for kind in self.kinds], "left_out": list(self.left_out)}

    def slot_labels(self, index: int) -> list[str]:
        return self.kinds[index].slot_labels(self.coefficient_slot_shapes[index])

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        return self.model(input_ids=input_ids, use_cache=False, **kwargs)

    def check_inputs(self, input_ids: torch.Tensor, coefficients: list[torch.Tensor] | None = None) -> None:
        check_window(input_ids, self.context_length, self.coefficient_slot_shapes, coefficients)

    @property
    def _first_calls(self) -> list[int]:
        """Each controller module's first controller (its only one, but for a module in a looped layer)."""
        return [index for index, group in enumerate(self._calls) if group[0] == index]

    def _this_call(self, first: int, calls: dict[int, int], run: str) -> int:
        """The controller this call of controller ``first``'s module is: the module's next one, counted in
        ``calls`` (per module, this forward); a call beyond them is a one-line error."""
        group = self._calls[first]
        calls[first] = calls.get(first, 0) + 1
        if calls[first] > len(group):
            times = "once" if len(group) == 1 else f"{len(group)} times"
            raise UserError(
                f"controller {self.controller_names[first].partition(CALL)[0]} runs more than {times} {run}; "
                "the adapter cannot replay it"
            )
        return group[calls[first] - 1]

    def capture_run(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[Values]]:
        """Logits and each controller's whole output (with its routing step's, where it has one),
        batch-first, recorded by forward hooks (one per module: its calls are its controllers in turn)."""
        batch, length = input_ids.shape
        values: list[Any] = [None] * len(self._controllers)
        calls: dict[int, int] = {}
        pending: dict[int, tuple[int, Any]] = {}  # per module, its call's router output waiting for the routing step

        def keep(index, output):
            read = itertools.count()  # the position of each tensor the kind reads

            def batch_first(tensor):
                position = next(read)
                layouts = self._flat[index]
                if layouts is None or position == len(layouts):  # the probe: learn the layout
                    self._flat[index] = [*(layouts or []), tuple(tensor.shape[:2]) != (batch, length)]
                lead = (batch * length,) if self._flat[index][position] else (batch, length)
                if tuple(tensor.shape[: len(lead)]) != lead:
                    raise UserError(
                        f"gives a {tuple(tensor.shape)} output for {batch}×{length} tokens; the adapter cannot use it"
                    )
                return tensor.detach().reshape(batch, length, *tensor.shape[len(lead) :])

            try:
                values[index] = self.kinds[index].to_values(output, batch_first)
            except UserError as exc:
                raise UserError(f"controller {self.controller_names[index]} {exc}") from None

        def record(first):
            def hook(module, args, kwargs, output):
                index = self._this_call(first, calls, "per forward, more than when the model was loaded")
                if self._steps[index] is None:
                    keep(index, output)
                else:
                    pending[first] = (index, output)

            return hook

        def step(first, original):
            def routing_step(*args, **kwargs):
                output = original(*args, **kwargs)
                index, routed = pending.pop(first)
                keep(index, (routed, output))
                return output

            return routing_step

        with contextlib.ExitStack() as stack:
            for first in self._first_calls:
                stack.callback(self._controllers[first].register_forward_hook(record(first), with_kwargs=True).remove)
                routing_step = self._steps[first]
                if routing_step is not None:
                    owner, attribute = routing_step
                    stack.enter_context(_replaced(owner, attribute, step(first, getattr(owner, attribute))))
            logits = self(input_ids).logits
        missing = [self.controller_names[i] for i, v in enumerate(values) if v is None]
        if missing:
            raise UserError(f"controllers {missing} did not run in a forward; the adapter cannot use them")
        return logits, values

    def _lead(self, index: int, batch: int, length: int) -> tuple[int, ...]:
        """The leading shape of controller ``index``'s (first) output for ``batch`` × ``length`` tokens."""
        layouts = self._flat[index]
        return (batch * length,) if layouts and layouts[0] else (batch, length)

    @contextlib.contextmanager
    def frozen_controllers(self, outputs: dict[int, Callable[..., Any]]) -> Iterator[None]:
        """Controller ``i`` (and its routing step) returns what ``outputs[i](*its arguments)`` gives, never
        running; ``outputs`` holds every controller of a module (each call of a looped one) or none."""
        replacements: dict[nn.Module, Callable[..., Any]] = {}
        routed: dict[int, Any] = {}  # per module, its call's routing
        calls: dict[int, int] = {}

        def controller(first):
            def forward(*args, **kwargs):
                index = self._this_call(first, calls, "in a replay, more than at capture")
                output = outputs[index](*args, **kwargs)
                if self._steps[index] is None:
                    return output
                routed[first] = output[1]
                return output[0]

            return forward

        def step(first):
            return lambda *args, **kwargs: routed.pop(first)

        with contextlib.ExitStack() as stack:
            for first in self._first_calls:
                if first not in outputs:
                    continue
                replacements[self._controllers[first]] = controller(first)
                routing_step = self._steps[first]
                if routing_step is not None:
                    stack.enter_context(_replaced(*routing_step, step(first)))
            stack.enter_context(frozen(replacements))
            yield

    def replay_run(self, input_ids: torch.Tensor, values: list[Values]) -> torch.Tensor:
        """Logits with every controller replaced by its values (``frozen``): no controller executes; each
        call of a looped one returns its own call's values."""
        lead = [self._lead(i, *input_ids.shape) for i in range(len(self._controllers))]
        live = [module.forward for module in self._controllers]  # a ColumnKind's projection runs live

        def output(index):
            kind = self.kinds[index]

            def replay(*args, **kwargs):
                if isinstance(kind, ColumnKind):
                    return kind.to_output(values[index], lead[index], live[index](*args, **kwargs))
                return kind.to_output(values[index], lead[index])

            return replay

        with self.frozen_controllers({i: output(i) for i in range(len(self._controllers))}):
            return self(input_ids).logits

    def expert_counts(self, index: int, value: Values) -> torch.Tensor | None:
        experts = self.kinds[index].experts
        return None if experts is None else experts(value)

    def latency_baseline(self) -> tuple[str, nn.Module]:
        """The static mixture (``StaticMixture``); for a model with no router (an SSM), which has no
        experts to run for every token, the same model with its controllers live."""
        if any(kind.experts is not None for kind in self.kinds):
            return "static_mixture", StaticMixture(self)
        return "same_model", StaticMixture(self)

    def positive_control(self, calibration_windows: torch.Tensor) -> PositiveControl | None:
        return None


class StaticMixture(nn.Module):
    """The same model with every expert run for every token: each router frozen to a uniform gate over its
    experts, other controllers live (a router model's latency baseline)."""

    def __init__(self, controlled: TransformersControlled):
        super().__init__()
        self.controlled = controlled

    def _uniform(self, index: int, batch: int, length: int) -> Callable[..., Any]:
        controlled = self.controlled
        experts = controlled.coefficient_slot_shapes[index][0]
        gate = torch.full((batch, length, experts), 1.0 / experts, device=controlled._device)
        output = controlled.kinds[index].to_output({COEFFICIENT: gate}, controlled._lead(index, batch, length))
        return lambda *args, **kwargs: output

    def forward(self, input_ids: torch.Tensor) -> Any:
        controlled = self.controlled
        routers = [i for i, kind in enumerate(controlled.kinds) if kind.experts is not None]
        with controlled.frozen_controllers({i: self._uniform(i, *input_ids.shape) for i in routers}):
            return controlled(input_ids)


@contextlib.contextmanager
def _replaced(owner: nn.Module, attribute: str, function: Callable[..., Any]) -> Iterator[None]:
    """``owner.attribute`` is ``function`` on the instance for the block (a routing step of a logits-only
    router), put back on exit."""
    previous = owner.__dict__.get(attribute)
    setattr(owner, attribute, function)
    try:
        yield
    finally:
        if previous is None:
            owner.__dict__.pop(attribute, None)
        else:
            setattr(owner, attribute, previous)
