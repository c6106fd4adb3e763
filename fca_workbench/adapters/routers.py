"""Routers found by role, whatever their class is called: a router is the child of a sparse-MoE block (a
module that holds experts) whose output selects the experts, named as its family declares
(``fca_workbench.adapters.families``). Each family's router output is one of the shapes transformers uses,
mapped to one routing form: ``(router_logits [N, L], top_k_weights [N, k], top_k_index [N, k])`` plus the
rest of the output, with the coefficient the dense gate over the L routing classes (top-k weights at their
indices; the last Z classes zero-computation experts where the family has them).
"""

import re
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fca_workbench.adapters.families import Family, family_of, zero_experts
from fca_workbench.adapters.kinds import (
    ROUTER_OUTPUT,
    TOP_K_INDEX,
    ControllerKind,
    cached_routing,
    dtype_only,
    replayed_routing,
)
from fca_workbench.adapters.protocol import COEFFICIENT
from fca_workbench.foundation.errors import UserError

LOOKS_LIKE_ROUTER = re.compile(r"(Router|Gating)$|TopK|Topk")  # a class name no kind claiming it is refused
# a router that looks its experts up by token id (DeepSeek-V4's hash layers): a token's indices may repeat
LOOKS_UP_EXPERTS = re.compile(r"HashRouter$")
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")

Routing = tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]  # logits, weights, index, rest


def is_sparse_block(module: nn.Module) -> bool:
    """A module that holds experts: an ``experts`` child, a child class ``*Experts``, or an expert count."""
    if isinstance(getattr(module, "experts", None), nn.Module):
        return True
    if any(type(child).__name__.endswith("Experts") for child in module.children()):
        return True
    return any(isinstance(getattr(module, field, None), int) for field in EXPERT_COUNT_FIELDS)


def find_routers(model: nn.Module) -> dict[str, ControllerKind]:
    """``{module path: kind}`` of every router of ``model``, by role: a child named as the family declares
    (``Family.router_names``) of a sparse-MoE block."""
    family = family_of(model.config)
    found: dict[str, ControllerKind] = {}
    for name, _ in model.named_modules():
        parent, _, child = name.rpartition(".")
        inside = any(name.startswith(router + ".") for router in found)
        if child in family.router_names and not inside and is_sparse_block(model.get_submodule(parent)):
            repeats = LOOKS_UP_EXPERTS.search(type(model.get_submodule(name)).__name__) is not None
            found[name] = router_kind(family, model.config, repeats)
    return found


def unclaimed_routers(model: nn.Module, claimed: list[str]) -> list[str]:
    """Modules outside every claimed controller whose class names a router: the adapter cannot audit them."""
    inside = tuple(name + "." for name in claimed)
    return [
        name
        for name, module in model.named_modules()
        if LOOKS_LIKE_ROUTER.search(type(module).__name__) and name not in claimed and not name.startswith(inside)
    ]


def _tensors(output: Any, count: int, what: str) -> tuple:
    if not (isinstance(output, tuple) and len(output) == count and all(isinstance(t, torch.Tensor) for t in output)):
        raise UserError(f"returns something other than {what}; the adapter cannot use it")
    return output


def _top_k_unpack(output: Any) -> Routing:
    logits, weights, index = _tensors(output, 3, "(router_logits, top_k_weights, top_k_index)")
    return logits, weights, index, {}


def _top_k_pack(logits, weights, index, rest):
    return logits, weights, index


def _gammas_unpack(output: Any) -> Routing:
    logits, weights, index, gammas = _tensors(output, 4, "(router_logits, top_k_weights, top_k_index, gammas)")
    return logits, weights, index, {"shared_gammas": gammas}


def _gammas_pack(logits, weights, index, rest):
    return logits, weights, index, rest["shared_gammas"]


def _scores_unpack(output: Any) -> Routing:
    """``(router_scores [N, E], router_logits [N, E])``: the scores are already the dense gate (zero off the
    top-k), so the routed experts are the nonzero scores."""
    scores, logits = _tensors(output, 2, "(router_scores, router_logits)")
    k = int((scores != 0).sum(-1).max())  # a routed score may underflow to 0; none is nonzero off the top-k
    weights, index = scores.topk(k, dim=-1)
    return logits, weights, index, {"router_scores": scores}


def _scores_pack(logits, weights, index, rest):
    scores = rest.get("router_scores")
    if scores is None:
        scores = torch.zeros(logits.shape, dtype=weights.dtype, device=weights.device).scatter(-1, index, weights)
    return scores, logits


def _sorted_unpack(output: Any) -> Routing:
    """JetMoE's ``(index_sorted_experts, batch_index, batch_gates, expert_size, logits)``: the routing sorted
    by expert, turned back into per-token top-k weights and indices."""
    if not (isinstance(output, tuple) and len(output) == 5 and isinstance(output[4], torch.Tensor)):
        raise UserError("returns something other than JetMoE's sorted routing; the adapter cannot use it")
    index_sorted, _, gates, expert_size, logits = output
    tokens, experts = logits.shape
    experts_sorted = torch.repeat_interleave(torch.arange(experts, device=logits.device), torch.tensor(expert_size))
    index = torch.empty_like(index_sorted).scatter(0, index_sorted, experts_sorted).view(tokens, -1)
    weights = torch.empty_like(gates).scatter(0, index_sorted, gates).view(tokens, -1)
    return logits, weights, index, {}


def _sorted_pack(logits, weights, index, rest):
    """The routing sorted by expert as ``JetMoeTopKGating.forward`` sorts it, from per-token top-k."""
    top_k = index.shape[-1]
    _, index_sorted = index.flatten().sort(0)
    expert_size = torch.bincount(index.flatten(), minlength=logits.shape[-1]).tolist()
    return (
        index_sorted,
        index_sorted.div(top_k, rounding_mode="trunc"),
        weights.flatten()[index_sorted],
        expert_size,
        logits,
    )


def _skip_unpack(output: Any) -> Routing:
    """Zaya's ``(router_logits [N, E+1], probs [N, k], index [N, k], router_states [B, T, H])``: a token
    routed to the skip class E arrives masked as expert 0 with weight 0; it is put back at E (an expert 0
    whose weight underflowed to 0 is the same computation)."""
    logits, weights, index, states = _tensors(output, 4, "(router_logits, probs, index, router_states)")
    skip = (weights == 0) & (index == 0)
    return logits, weights, index.masked_fill(skip, logits.shape[-1] - 1), {"router_states": states}


def _skip_pack(logits, weights, index, rest):
    skip = index == logits.shape[-1] - 1
    return logits, weights.masked_fill(skip, 0), index.masked_fill(skip, 0), rest["router_states"]


def _step_unpack(output: Any) -> Routing:
    """A logits-only router and its caller's routing step: ``(router_logits, (top_k_weights, top_k_index))``."""
    logits, step = output
    if not isinstance(logits, torch.Tensor):
        raise UserError("returns something other than router logits; the adapter cannot use it")
    weights, index = _tensors(step, 2, "(top_k_weights, top_k_index) from its routing step")
    return logits, weights, index, {}


def _step_pack(logits, weights, index, rest):
    return logits, (weights, index)


def _doge_route(self: Any, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``DogeCDMoE.forward``'s routing, as a method of its own: product keys → (routing_weights, indices)."""
    (scores_x, scores_y), (indices_x, indices_y) = router_logits.topk(self.num_keys, dim=-1)
    all_scores = scores_x.unsqueeze(-1) + scores_y.unsqueeze(-2)
    all_indices = indices_x.unsqueeze(-1) * self.num_keys + indices_y.unsqueeze(-2)
    all_scores = all_scores.view(*all_scores.shape[:-2], -1)
    all_indices = all_indices.view(*all_indices.shape[:-2], -1)
    scores, position_indices = all_scores.topk(self.top_k, dim=-1)
    indices = all_indices.gather(-1, position_indices)
    routing_weights = nn.functional.softmax(scores, dim=-1)
    if self.norm_topk_prob:
        routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
    return routing_weights, indices


def _doge_forward(self: Any, hidden_states: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``DogeCDMoE.forward`` (transformers 5.24) with its routing called as ``self.route_product_keys`` on
    ``[2, B, T, keys]`` (so that the step's output is batch-first like its router's), so that the step can be
    recorded and replaced; every row computed as in the original."""
    bsz, seq_len, _ = hidden_states.shape
    router_logits = self.router_gate(hidden_states).view(2, bsz * seq_len, -1)
    routing_weights, indices = self.route_product_keys(router_logits.view(2, bsz, seq_len, -1))
    routing_weights, indices = routing_weights.view(bsz * seq_len, -1), indices.view(bsz * seq_len, -1)
    down_embed = self.down_embed(indices)
    up_embed = self.up_embed(indices)
    experts_weights = torch.matmul(down_embed, hidden_states.view(bsz * seq_len, -1, 1)).view(bsz * seq_len, -1)
    experts_weights = self.act_fn(experts_weights) * routing_weights
    experts_states = torch.matmul(experts_weights.view(bsz * seq_len, 1, -1), up_embed).view(bsz, seq_len, -1)
    hidden_states = self.down_proj(self.act_fn(self.gate_proj(hidden_states)) * self.up_proj(hidden_states))
    hidden_states = hidden_states + experts_states
    return hidden_states, router_logits


# a block whose routing step is inline in its forward: the forward that calls it as a method, and the step
SPLIT_FORWARDS = {"route_product_keys": (_doge_forward, _doge_route)}


def split_routing_step(block: nn.Module, step: str) -> None:
    """Give ``block`` the routing step ``step`` as a method of the instance, where its forward computes it
    inline (``SPLIT_FORWARDS``); the forward is swapped for one that calls it, numerically the same."""
    if step in SPLIT_FORWARDS and step not in vars(block):
        forward, route = SPLIT_FORWARDS[step]
        setattr(block, step, types.MethodType(route, block))
        block.forward = types.MethodType(forward, block)


OUTPUTS: dict[str, tuple[Callable[[Any], Routing], Callable[..., Any]]] = {  # Family.output → (unpack, pack)
    "top_k": (_top_k_unpack, _top_k_pack),
    "top_k_gammas": (_gammas_unpack, _gammas_pack),
    "scores_logits": (_scores_unpack, _scores_pack),
    "sorted": (_sorted_unpack, _sorted_pack),
    "skip_class": (_skip_unpack, _skip_pack),
    "logits_step": (_step_unpack, _step_pack),
    "product_keys": (_step_unpack, _step_pack),
}
GATE_EXTRAS = {"top_k_gammas": "shared_gammas"}  # output rest that is a gate too: it joins the coefficient
DERIVED = {"router_scores"}  # output rest the dense gate is (in its own dtype): cached as its dtype alone
NATIVE_BATCH_FIRST = {"router_states"}  # output rest already [B, T, ...]: returned as it is


def router_kind(family: Family, config: Any, repeats: bool = False) -> ControllerKind:
    """The controller kind of ``family``'s routers (``config`` gives its zero-computation experts, product-key
    classes, shared-expert gates and k; ``repeats``: a token's indices may repeat, so the cache keeps the top-k
    weights whole)."""
    unpack, pack = OUTPUTS[family.output]
    zero = zero_experts(family, config)
    gate_extra = GATE_EXTRAS.get(family.output)
    shared = config.n_shared_experts if gate_extra is not None else 0  # gates after the routing classes'

    def classes(logits) -> int:
        """Routing classes: one per logit, or as many as the config declares (product keys)."""
        return getattr(config, family.classes) if family.classes else logits.shape[-1]

    def to_values(output, batch_first) -> dict:
        logits, weights, index, rest = unpack(output)
        logits, weights, index = batch_first(logits), batch_first(weights), batch_first(index)
        rest = {key: batch_first(tensor) for key, tensor in rest.items()}
        gate = torch.zeros((*logits.shape[:-1], classes(logits)), dtype=torch.float32, device=logits.device)
        gate = gate.scatter_add(-1, index, weights.float())
        coefficient = gate if gate_extra is None else torch.cat([gate, rest[gate_extra].float()], -1)
        values = {COEFFICIENT: coefficient, **cached_routing(gate, index, weights, logits, repeats)}
        values.update({key: dtype_only(t) if key in DERIVED or key == gate_extra else t for key, t in rest.items()})
        return values

    def to_output(values, lead):
        def native(tensor):
            return tensor.reshape(*lead, *tensor.shape[2:])

        coefficient = values[COEFFICIENT]
        gate = coefficient[..., : coefficient.shape[-1] - shared]
        rest = {}
        if gate_extra is not None:
            rest[gate_extra] = native(coefficient[..., gate.shape[-1] :].to(values.get(gate_extra, gate).dtype))
        if TOP_K_INDEX in values:
            cached = {key: value for key, value in values.items() if key not in (COEFFICIENT, gate_extra)}
            routing = replayed_routing(gate, cached)
            for key, value in cached.items():
                if key in DERIVED:
                    rest[key] = native(gate.to(value.dtype))
                elif key not in ROUTER_OUTPUT:
                    rest[key] = value if key in NATIVE_BATCH_FIRST else native(value)
            return pack(*(native(t) for t in routing), rest)
        if family.output == "skip_class":  # the next router's input: that router is frozen too
            rest["router_states"] = coefficient.new_zeros(*coefficient.shape[:2], config.router_hidden_size)
        return pack(*(t.reshape(*lead, t.shape[-1]) for t in static_mixture(gate)), rest)

    def static_mixture(gate):
        """Every routing class with a nonzero gate anywhere in the batch runs, weighted by its gate (the gate
        stands in for the router logits, which the block discards); or, ``fixed_k``, each token's top-k."""
        if family.fixed_k:
            return gate, *gate.topk(config.num_experts_per_tok, dim=-1)
        used = (gate != 0).flatten(0, -2).any(dim=0).nonzero().squeeze(1)
        return gate, gate.index_select(-1, used), used.expand(*gate.shape[:-1], len(used))

    def experts(values):
        if TOP_K_INDEX not in values:
            return None
        count = values[COEFFICIENT].shape[-1] - shared
        return torch.bincount(values[TOP_K_INDEX].flatten().long().cpu(), minlength=count)[: count - zero]

    def slot_labels(slot_shape: tuple[int, ...]) -> list[str]:
        real = slot_shape[0] - shared - zero
        labels = [f"expert {e}" for e in range(real)] + [f"zero expert {e}" for e in range(zero)]
        return labels + [f"shared expert {e}" for e in range(shared)]

    return ControllerKind(
        f"router:{family.output}", lambda name, module: False, to_values, to_output, experts, slot_labels, family.step
    )
