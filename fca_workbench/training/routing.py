"""Router design while training (the router-design study): the router z-loss, a router that reads the hidden
state detached from the gradient, and frozen routers (a fine-tuned static export keeps its zero routers, so every
token keeps taking every kept expert equally), for the transformers mixture-of-experts models ``fca train``
builds (``--hf-config``) or starts from (``--init``).

All act on the model from outside (a loss term, a forward pre-hook on each router, ``requires_grad``), so the
saved checkpoint is the plain transformers model: nothing of any is in its weights or its config.
"""

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from transformers import PreTrainedModel

from fca_workbench.adapters.routers import find_routers
from fca_workbench.foundation.errors import UserError
from fca_workbench.training.train_settings import DETACHED, TrainSettings


def router_z_loss(router_logits: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """ST-MoE's router z-loss: the mean over every layer's tokens of logsumexp(router logits)², which keeps the
    logits small (a router whose logits grow saturates its softmax)."""
    logits = torch.cat([layer.float() for layer in router_logits])
    return torch.logsumexp(logits, dim=-1).square().mean()


def check_routers(model: PreTrainedModel, flags: str) -> list[str]:
    """The module paths of the model's top-k routers; a one-line refusal of ``flags`` when it has none."""
    routers = list(find_routers(model))
    if not routers:
        raise UserError(f"{flags} shape mixture-of-experts routers; this {model.config.model_type} model has none")
    return routers


def prepare_routers(model: PreTrainedModel, settings: TrainSettings) -> None:
    """Check that a model the router-design flags ask for has routers; detach their input or freeze their
    weights (the optimizer leaves parameters without gradients alone) if asked."""
    asked = [flag for flag, given in settings.router_flags().items() if given]
    if asked:
        check_routers(model, ", ".join(asked))
    if settings.router_input == DETACHED:
        detach_router_inputs(model)
    if settings.freeze_routers:
        for name in check_routers(model, "--freeze-routers"):
            model.get_submodule(name).requires_grad_(False)


def detach_router_inputs(model: PreTrainedModel) -> list[RemovableHandle]:
    """Every router of ``model`` reads its input without the gradient: the loss trains the router's weights
    through the routing weights, but never moves the hidden state to suit the router."""
    return [
        model.get_submodule(name).register_forward_pre_hook(_detached)
        for name in check_routers(model, "--router-input detached")
    ]


def _detached(module: nn.Module, args: tuple) -> tuple:
    return tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
