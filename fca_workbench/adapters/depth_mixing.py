"""Cross-layer mixing weights as controllers: a learned query attending over a stack of hidden states, one
row of weights per token (Inkling2's block attention residuals: softmax(q · norm(states)ᵀ · scale) over the
earlier blocks' outputs and the current one), computed by transformers inside an attention kernel.

The gate probe finds them by role (``fca_workbench.adapters.gate_probe``); the owner keeps its forward (the
stack, its norm, the queries) and only its attention call changes. Its ``config`` is shadowed on the
instance by a view naming ``EXPLICIT`` as its attention implementation (registered with transformers'
``AttentionInterface``), so the call runs ``explicit_mixing``: the weights come from a ``ParameterGate`` of
their own (hooks record it, replay replaces it) and the mix is their product with the stacked states. That
is the eager kernel's own expression, op for op, in capture and replay alike: on the tiny zoo models
(float32) the logits equal those of the model's own kernel bit for bit (max abs difference 0.0); eager is
the only attention implementation Inkling2 supports.

The coefficient is the mixing probabilities ``[B, T, queries, depth]``, not the scores: they are what the
mix multiplies the states by, so a replayed value is used as it stands (a profile or another input's
weights are mixtures over depth as given, where scores would pass through the softmax again), and replaying
the captured ones is the same product of the same tensors, exact without recomputing anything.
"""

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface

from fca_workbench.adapters.families import CROSS_LAYER_MIXING
from fca_workbench.adapters.kinds import ControllerKind
from fca_workbench.adapters.selective import ParameterGate, whole_kind
from fca_workbench.foundation.errors import UserError

EXPLICIT = "fca_explicit_mixing"  # the attention implementation a mixing owner's config names


def depth_labels(slot_shape: tuple[int, ...]) -> list[str]:
    """``depth 0`` ... for one query; ``query 0 depth 0`` ... for several (a full layer's q, k, v inputs)."""
    queries, depth = slot_shape
    if queries == 1:
        return [f"depth {d}" for d in range(depth)]
    return [f"query {q} depth {d}" for q in range(queries) for d in range(depth)]


MIXING: ControllerKind = whole_kind(CROSS_LAYER_MIXING, depth_labels)


def _mixing_weights(owner: nn.Module, query: torch.Tensor, key: torch.Tensor, scaling: float) -> torch.Tensor:
    """Eager attention's weights: the softmax over the stack of the query's scaled scores, in float32."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    return F.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)


class MixingConfig:
    """The owner's config as its forward reads it: ``EXPLICIT`` as its attention implementation, ``gate``
    its mixing weights' module, every other field the model's config's."""

    _attn_implementation = EXPLICIT

    def __init__(self, config: Any, gate: ParameterGate):
        self.config = config
        self.gate = gate

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "config":  # copy and pickle probe for these before __init__
            raise AttributeError(name)
        return getattr(self.config, name)


def explicit_mixing(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager attention of ``module``'s queries ``[B, T, queries, width]`` over its stack
    ``[B, T, depth, width]``, the weights from its gate module (``mixing_gate``)."""
    config = module.__dict__.get("config")
    if not isinstance(config, MixingConfig):
        raise UserError(f"{type(module).__name__} is not a cross-layer mixing the adapter installed")
    if attention_mask is not None or dropout or kwargs or key.shape[1] != query.shape[1]:
        raise UserError(
            f"{type(module).__name__} attends over its stack with a mask, dropout, grouped keys or further "
            "arguments; the adapter's explicit cross-layer mixing takes none"
        )
    weights = config.gate(query, key, scaling)
    output = torch.matmul(weights.to(value.dtype), value)
    return output.transpose(1, 2).contiguous(), weights


def mixing_gate(owner: nn.Module) -> ParameterGate | None:
    """The module of ``owner``'s mixing weights, installed once on the instance (its ``config`` shadowed by a
    ``MixingConfig``); None for an owner that names no attention implementation in its config, whose kernel
    the adapter cannot reach."""
    config = owner.__dict__.get("config")
    if isinstance(config, MixingConfig):
        return config.gate
    if not hasattr(config, "_attn_implementation"):
        return None
    AttentionInterface.register(EXPLICIT, explicit_mixing)
    gate = ParameterGate(owner, _mixing_weights)
    owner.__dict__["config"] = MixingConfig(config, gate)
    return gate
