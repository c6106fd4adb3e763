"""Controller kinds, declared as data: how to find a controller module, how its output becomes the values
the cache keeps (``"coefficient"`` plus what replay needs of the rest of the output, nothing the coefficient
holds stored twice), and how values become the output to
return during replay. Adding a family is one ``ControllerKind``; capture and replay exist once
(``fca_workbench.adapters.hf``).

A kind owns its output's keys: the core learns a router's k from ``top_k`` and names a controller's slots
with its ``slot_labels``, never by reading those keys itself.

Every output tensor's leading dimensions are the controller input's (``[B·T]`` flattened or ``[B, T]``);
values are kept batch-first ``[B, T, ...]`` and reshaped back to the input's layout on replay.
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from fca_workbench.adapters.protocol import COEFFICIENT
from fca_workbench.foundation.errors import UserError
from fca_workbench.models.common import index_slot_labels

ROUTER_OUTPUT = ("router_logits", "top_k_weights", "top_k_index")
ROUTER_LOGITS, TOP_K_WEIGHTS, TOP_K_INDEX = ROUTER_OUTPUT  # TOP_K_INDEX [B, T, k]: the experts each token is routed to


@dataclass(frozen=True)
class ControllerKind:
    """``find(name, module)``: is this module a controller of this kind. ``to_values(output, batch_first)``:
    the output as named batch-first tensors (``batch_first(t)`` reshapes one tensor). ``to_output(values,
    lead)``: the output to return for inputs with leading shape ``lead``. ``experts(values)``: evaluations
    per real expert; None for controllers that select no experts. ``slot_labels(slot_shape)``: the names of a
    coefficient's flattened slots. ``step``: for a router that returns only logits, the attribute of its parent
    module that turns them into the routing (its caller's routing step); capture records it with the router
    and replay replaces both, so ``to_values`` gets ``(router output, step output)`` and ``to_output`` returns
    that pair."""

    name: str
    find: Callable[[str, nn.Module], bool]
    to_values: Callable
    to_output: Callable
    experts: Callable | None = None
    slot_labels: Callable[[tuple[int, ...]], list[str]] = index_slot_labels
    step: str | None = None


def class_suffix(*suffixes: str) -> Callable[[str, nn.Module], bool]:
    """A ``find`` that claims modules whose class name ends with one of ``suffixes``."""
    return lambda name, module: type(module).__name__.endswith(suffixes)


def name_pattern(pattern: str) -> Callable[[str, nn.Module], bool]:
    """A ``find`` that claims modules whose whole path matches ``pattern``."""
    compiled = re.compile(pattern)
    return lambda name, module: compiled.fullmatch(name) is not None


def _tensor_values(output, batch_first) -> dict:
    if not isinstance(output, torch.Tensor):
        raise UserError(f"returns a {type(output).__name__}, not a tensor; the adapter cannot use it")
    return {COEFFICIENT: batch_first(output)}


def _tensor_output(values, lead):
    coefficient = values[COEFFICIENT]
    return coefficient.reshape(*lead, *coefficient.shape[2:])


INDEX_DTYPES = (torch.uint8, torch.int16, torch.int32)  # what a cache stores top-k indices in


def index_dtype(classes: int) -> torch.dtype:
    """The smallest integer type that holds every index of ``classes`` routing classes."""
    return next(dtype for dtype in INDEX_DTYPES if classes <= torch.iinfo(dtype).max + 1)


def dtype_only(tensor: torch.Tensor) -> torch.Tensor:
    """``[B, T, 0]`` of ``tensor``'s dtype: an output the cache derives from the coefficient keeps only its
    dtype, so replaying it is exact at no bytes."""
    return tensor.new_empty((*tensor.shape[:2], 0))


def cached_routing(
    gate: torch.Tensor, index: torch.Tensor, weights: torch.Tensor, logits: torch.Tensor, repeats: bool = False
) -> dict:
    """What the cache keeps of a routing whose dense gate is ``gate``: the top-k index in the smallest integer
    type, the top-k weights and router logits as their dtypes alone (the weights are the gate at the index;
    the block discards the logits). ``repeats``: a token's indices may repeat (the gate holds their sum), so the
    weights are kept whole."""
    return {
        TOP_K_INDEX: index.to(index_dtype(gate.shape[-1])),
        TOP_K_WEIGHTS: weights if repeats else dtype_only(weights),
        ROUTER_LOGITS: dtype_only(logits),
    }


def replayed_routing(gate: torch.Tensor, values: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(router_logits, top_k_weights, top_k_index)`` from ``cached_routing``'s values and the dense gate: the
    weights kept whole, or gathered at the index in their own dtype (the gate holds them exactly, in float32),
    the gate in the logits' dtype standing in for the logits."""
    index, weights = values[TOP_K_INDEX].long(), values[TOP_K_WEIGHTS]
    if weights.shape[-1] == 0:
        weights = gate.gather(-1, index).to(weights.dtype)
    return gate.to(values[ROUTER_LOGITS].dtype), weights, index


def _router_values(output, batch_first) -> dict:
    """``(router_logits [N, E], top_k_weights [N, k], top_k_index [N, k])`` as the dense gate (the top-k
    weights scattered at their indices, zeros elsewhere) plus ``cached_routing``."""
    if not (isinstance(output, tuple) and len(output) == 3 and all(isinstance(t, torch.Tensor) for t in output)):
        raise UserError(
            "returns something other than (router_logits, top_k_weights, top_k_index); the adapter cannot use it"
        )
    logits, weights, index = (batch_first(t) for t in output)
    gate = torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter(-1, index, weights.float())
    return {COEFFICIENT: gate, **cached_routing(gate, index, weights, logits)}


def _router_output(values, lead):
    """The cached routing as it was; or, from a coefficient alone (a static profile), the static mixture:
    every expert with a nonzero gate anywhere in the batch runs, weighted by its gate (the gate stands in
    for the router logits, which the block discards)."""
    gate = values[COEFFICIENT]
    if TOP_K_INDEX in values:
        return tuple(t.reshape(*lead, t.shape[-1]) for t in replayed_routing(gate, values))
    experts = (gate != 0).flatten(0, -2).any(dim=0).nonzero().squeeze(1)
    weights = gate.index_select(-1, experts)
    index = experts.expand(*gate.shape[:-1], len(experts))
    return tuple(t.reshape(*lead, t.shape[-1]) for t in (gate, weights, index))


def _router_experts(values):
    if TOP_K_INDEX not in values:
        return None
    return torch.bincount(values[TOP_K_INDEX].flatten().long().cpu(), minlength=values[COEFFICIENT].shape[-1])


def expert_slot_labels(slot_shape: tuple[int, ...]) -> list[str]:
    """A router's coefficient is its dense gate: one slot per expert, ``expert 0``, ..."""
    return [f"expert {e}" for e in range(slot_shape[0])]


def top_k(values: dict[str, torch.Tensor]) -> int | None:
    """The k of the router whose captured ``values`` these are (the width of its top-k index); None for a
    controller that routes to no experts, or values holding only a coefficient."""
    index = values.get(TOP_K_INDEX)
    return None if index is None else index.shape[-1]


TOP_K_ROUTER = ControllerKind(
    "top_k_router",
    class_suffix("TopKRouter", "TopkRouter"),
    _router_values,
    _router_output,
    _router_experts,
    expert_slot_labels,
)
SHARED_EXPERT_GATE = ControllerKind(
    "shared_expert_gate", name_pattern(r".*\.shared_expert_gate"), _tensor_values, _tensor_output
)

# Tried in order; the first kind that finds a module claims it. MoE routers are found by role where no kind
# claims them (``fca_workbench.adapters.routers``); ``TOP_K_ROUTER`` is for ``register_kind``.
KINDS: list[ControllerKind] = [SHARED_EXPERT_GATE]


def register_kind(kind: ControllerKind) -> None:
    """Add a controller kind for models of your own (tried before the built-in ones)."""
    KINDS.insert(0, kind)


def tensor_kind(pattern: str) -> ControllerKind:
    """Controllers named by ``pattern`` (matched against the whole module path) whose output is a tensor:
    the coefficient is the tensor itself (``fca audit --controllers``)."""
    return ControllerKind(f"tensor:{pattern}", name_pattern(pattern), _tensor_values, _tensor_output)
