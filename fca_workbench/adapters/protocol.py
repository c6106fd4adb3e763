"""The controlled-model protocol: the one interface the core (capture, replay, metrics, execution, audit,
dashboard) speaks to, whatever the model family.

A controlled model is a ``torch.nn.Module`` (parameters, ``config``, ``to``, ``eval``; calling it runs the
live model) with:

* ``arch``: the family (``featuregate``, ..., or a transformers ``model_type``);
* ``controllers`` / ``controller_names``: the controller modules and their paths (``audit.json``
  ``model.controllers``); entry i of every per-controller list below belongs to controller i;
* ``coefficient_slot_shapes``: per controller, the shape of one token's coefficient (FeatureGate
  ``[2, G]``, MUDDPythia ``[C, i+2]``, a router's dense gate ``[E]``);
* ``context_length`` and ``blocks`` (the per-layer modules, counted by the execution audit);
* ``capture_run(input_ids) -> (logits, values)``: one unperturbed forward; ``values[i]`` is a dict of
  batch-first tensors ``[B, T, ...]``: ``"coefficient"`` (what statistics and static profiles use) plus
  whatever else the controller's output holds (a router's whole output), so that replaying them is exact;
* ``replay_run(input_ids, values) -> logits``: the frozen forward, no controller executed. A value holding
  only ``"coefficient"`` (a static profile) is turned into an output by the controller's kind;
* ``expert_counts(i, value)``: evaluations per expert in ``value`` (routers), else None;
* ``latency_baseline() -> (name, model or forward callable)`` and ``positive_control(calibration_windows)``
  (a copy that really skips work, or None) for the execution audit;
* ``supports_stepping`` and, where True, ``embed`` / ``run_blocks`` / ``head`` / ``resume_layer`` /
  ``check_inputs`` for prefix reuse (``fca_workbench.prefix``).

The native families implement it through their seam (``CoefficientModel``); ``TransformersControlled``
implements it for any ``transformers`` causal LM by replacing controllers' ``forward`` (``frozen``).
"""

import contextlib

from torch import nn

COEFFICIENT = "coefficient"


@contextlib.contextmanager
def frozen(replacements: dict[nn.Module, object]):
    """Install ``replacements[module]`` as each module's ``forward`` on the instance, so calling the module
    returns what the replacement returns and the module's own forward never runs (a forward hook could
    not do that: the module would still run). The previous forwards are put back on exit, also when an
    exception escapes."""
    saved = []
    try:
        for module, forward in replacements.items():
            saved.append((module, module.__dict__.get("forward")))
            module.forward = forward
        yield
    finally:
        for module, previous in reversed(saved):
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
