"""``FCACallback``: the training mini-audit inside a ``transformers.Trainer``, logged like its own metrics.

The model may be a workbench model or a transformers causal LM the adapters can audit (a mixture of experts:
``MiniAudit`` sees it through ``adapters.controlled_view`` and adds the router figures).

The figures go out through ``Trainer.log`` ("log logs on the various objects watching training"), which
appends them to ``state.log_history`` and hands them to every reporter's ``on_log`` (TensorBoard, MLflow,
W&B, ...). A callback cannot do this by editing the ``logs`` of its own ``on_log`` or the ``metrics`` of
``on_evaluate``: the reporters are registered first and the Trainer logs evaluation metrics before calling
``on_evaluate``, so they would already have been sent. Hence the callback holds its Trainer::

    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.add_callback(FCACallback(trainer, MiniAudit.from_splits(tokenizer, 256, 16), every=100))
"""

from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from fca_workbench.audit.mini import MiniAudit


class FCACallback(TrainerCallback):
    """Run ``audit`` every ``every`` optimizer steps and/or after each evaluation; log ``<prefix><figure>``."""

    def __init__(
        self,
        trainer: Trainer,
        audit: MiniAudit,
        every: int | None = None,
        at_evaluate: bool = False,
        prefix: str = "fca/",
    ) -> None:
        if every is None and not at_evaluate:
            raise ValueError("FCACallback needs every=N steps, at_evaluate=True, or both")
        if every is not None and every < 1:
            raise ValueError(f"every must be a positive number of steps, got {every}")
        self.trainer, self.audit, self.every, self.at_evaluate, self.prefix = trainer, audit, every, at_evaluate, prefix
        self.audited_step: int | None = None

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        if self.every and state.global_step % self.every == 0:
            self.log_audit(state, model)

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        if self.at_evaluate:
            self.log_audit(state, model)

    def log_audit(self, state: TrainerState, model: torch.nn.Module | None) -> None:
        """One audit per step: an evaluation at an already audited step logs nothing new."""
        if self.audited_step == state.global_step:
            return
        self.audited_step = state.global_step
        model = model if model is not None else self.trainer.model
        if model is None:
            raise ValueError("FCACallback: the Trainer holds no model to audit")
        figures = self.audit(model)
        self.trainer.log({f"{self.prefix}{name}": value for name, value in figures.items()})
