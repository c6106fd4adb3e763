"""Mixture-of-experts models with a static routing profile folded into their experts.

Under a static profile the audit's replay (``kinds._router_output``) runs, in each MoE block, every expert
whose gate is nonzero, weighted by that gate, for every token: ``Σ_e w_e · expert_e(h)``. The exported model
is the same family with ``num_experts = K`` (the most experts a layer keeps) and ``num_experts_per_tok = K``:
its routers' weights are zero, so every token's softmax gives each of the K experts ``1/K`` (renormalised
or not), and ``K · w_e`` is folded into expert e's down projection; a layer keeping fewer experts than K is
padded with silent ones (zero weights). ``layer_mean_topk`` keeps k experts a layer (k/E of the expert
compute); ``layer_mean`` keeps every routed one (exact, no saving).

Only families whose router is a bare ``weight [E, hidden]`` followed by softmax and top-k, and whose experts
are the fused ``gate_up_proj [E, 2I, hidden]`` / ``down_proj [E, hidden, I]`` without biases, are folded
(their ``Family.experts`` is declared in ``fca_workbench.adapters.families``), with Qwen2-MoE's shared-expert gate
(a constant sigmoid on the shared expert); others, and models with any other controller, are refused in one line.
"""

import copy
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from fca_workbench.adapters.families import MOE_FAMILIES
from fca_workbench.adapters.hf import TransformersControlled
from fca_workbench.adapters.routers import find_routers
from fca_workbench.foundation.errors import UserError

FOLDABLE = {model_type: f.experts for model_type, f in MOE_FAMILIES.items() if f.experts}  # → its experts field
EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")
SHARED_GATE = "shared_expert_gate"  # Qwen2-MoE: sigmoid(shared_expert_gate(h)) scales the block's shared expert


def is_shared_gate(model: nn.Module, name: str) -> bool:
    """A bias-free ``shared_expert_gate`` beside a ``shared_expert`` whose ``down_proj`` has no bias."""
    parent, _, child = name.rpartition(".")
    block = model.get_submodule(parent)
    down = getattr(getattr(block, "shared_expert", None), "down_proj", None)
    gate = getattr(block, SHARED_GATE, None)
    plain = [isinstance(m, nn.Linear) and m.bias is None for m in (gate, down)]
    return child == SHARED_GATE and all(plain)


def check_foldable(controlled: TransformersControlled) -> None:
    """Refuse, in one line, a model of a ``FOLDABLE`` family whose static profile this module cannot fold exactly
    (a controller besides its routers, a router or experts of another shape)."""
    routers = find_routers(controlled.model)
    others = [n for n in controlled.controller_names if n not in routers and not is_shared_gate(controlled.model, n)]
    if others:
        raise UserError(
            f"controller {others[0]} is not an MoE router; fca export folds routers and shared-expert gates"
        )
    for name in routers:
        block = controlled.model.get_submodule(name.rpartition(".")[0])
        router, experts = block.get_submodule(name.rpartition(".")[2]), getattr(block, "experts", None)
        if [n for n, _ in router.named_parameters()] != ["weight"] or experts is None:
            raise UserError(f"router {name} is not a bare weight beside its experts; fca export cannot fold it")
        if sorted(n for n, _ in experts.named_parameters()) != sorted(EXPERT_WEIGHTS):
            raise UserError(f"the experts beside {name} are not fused gate_up_proj/down_proj; cannot fold them")


def kept_experts(gates: list[torch.Tensor]) -> tuple[list[torch.Tensor], int]:
    """Per router, the experts its static gate ``[E]`` runs (nonzero, as the replay's static mixture), and K,
    the most any router keeps."""
    kept = [gate.nonzero().squeeze(1) for gate in gates]
    return kept, max(1, max(len(k) for k in kept))


def fold_routers(controlled: TransformersControlled, gates: list[torch.Tensor]) -> PreTrainedModel:
    """The model's family with K experts per MoE block, every one taken by every token (zero router weights),
    each expert's down projection scaled by ``K · w_e``; a shared-expert gate's constant logit c becomes a zero
    weight (sigmoid 1/2) and ``2·sigmoid(c)`` in the shared expert's down projection; the rest as they are."""
    model: Any = controlled.model
    routers = find_routers(model)
    names = [name for name in controlled.controller_names if name in routers]
    kept, k = kept_experts([gate for name, gate in zip(controlled.controller_names, gates) if name in routers])
    experts_of = dict(zip(names, kept))
    config = copy.deepcopy(model.config)
    setattr(config, FOLDABLE[controlled.arch], k)  # through the config's attribute_map, where it has one
    config.num_experts_per_tok = k
    state = dict(model.state_dict())
    for name, gate in zip(controlled.controller_names, gates):
        block = name.rpartition(".")[0]
        weight = state[f"{name}.weight"]
        if name not in experts_of:  # a shared-expert gate
            state[f"{name}.weight"] = torch.zeros_like(weight)
            down = f"{block}.shared_expert.down_proj.weight"
            state[down] = state[down] * (2 * torch.sigmoid(gate.to(weight.dtype))).squeeze()
            continue
        experts = experts_of[name]
        state[f"{name}.weight"] = torch.zeros(k, weight.shape[1], dtype=weight.dtype)
        scale = (gate[experts] * k).to(weight.dtype)
        gate_up, down = (state[f"{block}.experts.{w}"] for w in EXPERT_WEIGHTS)
        state[f"{block}.experts.gate_up_proj"] = padded(gate_up[experts], k)
        state[f"{block}.experts.down_proj"] = padded(down[experts] * scale[:, None, None], k)
    folded = type(model)(config)
    folded.load_state_dict(state, strict=True)
    return folded.to(weight.dtype).eval()


def expert_counts(controlled: TransformersControlled, folded: PreTrainedModel) -> dict[str, int]:
    """The model card's ``experts``: per MoE block, experts kept (K) of the source's routed experts (E)."""
    field = FOLDABLE[controlled.arch]
    return {"kept": getattr(folded.config, field), "source": getattr(controlled.model.config, field)}


def padded(weights: torch.Tensor, k: int) -> torch.Tensor:
    """``weights [n, ...]`` with ``k - n`` silent (all-zero) experts after them."""
    return torch.cat([weights, weights.new_zeros(k - len(weights), *weights.shape[1:])]).contiguous()
