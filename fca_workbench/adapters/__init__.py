"""Any checkpoint as a controlled model: the protocol the core speaks (``ControlledModel``, ``SteppingModel``),
controller kinds, the transformers adapter.

Native folders load strictly through ``fca_workbench.models``; any other ``model_type`` that transformers knows
is loaded from local safetensors and wrapped in ``TransformersControlled`` (``loading.load_controlled``);
``open_checkpoint`` is the whole load: device, placement, model and its tokenizer.
"""

from fca_workbench.adapters.controlled import controlled_view, load_controlled, load_transformers, open_checkpoint
from fca_workbench.adapters.hf import TransformersControlled, find_controllers
from fca_workbench.adapters.kinds import ControllerKind, class_suffix, name_pattern, register_kind, tensor_kind
from fca_workbench.adapters.protocol import COEFFICIENT, ControlledModel, SteppingModel, frozen

__all__ = [
    "COEFFICIENT",
    "ControlledModel",
    "ControllerKind",
    "SteppingModel",
    "TransformersControlled",
    "class_suffix",
    "controlled_view",
    "find_controllers",
    "frozen",
    "load_controlled",
    "load_transformers",
    "name_pattern",
    "open_checkpoint",
    "register_kind",
    "tensor_kind",
]
