"""lm-eval's Hugging Face model (``HFLM``), answering loglikelihood, rolling loglikelihood and generation with
the logits of one condition at a time (``frozen.ConditionLogits``)."""

from typing import Any

import torch
from lm_eval.models.huggingface import HFLM
from transformers import PreTrainedTokenizerBase

from fca_workbench.adapters.hf import TransformersControlled
from fca_workbench.adapters.protocol import ControlledModel
from fca_workbench.audit.distributed import SINGLE, Ranks
from fca_workbench.downstream.frozen import ConditionLogits
from fca_workbench.foundation.errors import UserError


class WorkbenchLM(HFLM):
    """``HFLM`` over a controlled model; every forward lm-eval asks for goes through ``use``'s condition.

    ``window``: the longest input (lm-eval cuts contexts to it from the left), the calibration windows' length,
    so a per-position profile covers every position. Generation is greedy, token by token, one text at a time
    (no key-value cache: the frozen model reruns the whole text)."""

    def __init__(
        self,
        model: ControlledModel,
        tokenizer: PreTrainedTokenizerBase,
        window: int,
        batch_size: int,
        ranks: Ranks = SINGLE,
    ) -> None:
        module = model.model if isinstance(model, TransformersControlled) else model
        super().__init__(
            pretrained=module, backend="causal", tokenizer=tokenizer, max_length=window, batch_size=batch_size
        )
        self.controlled, self.ranks = model, ranks
        self._rank, self._world_size = ranks.rank, ranks.world_size  # lm-eval shares the documents by these
        self.logits: ConditionLogits | None = None

    def all_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's ``tensor`` joined along dim 0 (a number as one row), as accelerate's ``gather``."""
        if self.world_size == 1:
            return tensor
        row = tensor.reshape(1) if tensor.dim() == 0 else tensor
        parts = [torch.empty_like(row) for _ in range(self.world_size)]
        torch.distributed.all_gather(parts, row)
        return torch.cat(parts)

    def barrier(self) -> None:
        self.ranks.barrier()

    def use(self, logits: ConditionLogits) -> None:
        """Answer every request from now on under ``logits``' condition."""
        self.logits = logits

    def _model_call(
        self, inps: torch.Tensor, attn_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.logits is None:
            raise ValueError("WorkbenchLM.use(condition) comes before any request")
        return self.logits(inps)

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **kwargs: Any) -> torch.Tensor:
        """Each text of ``context`` (left-padded, ``attention_mask`` marks its tokens) continued greedily up to
        ``max_length`` tokens in all or a stop string, padded back to one tensor as ``HFLM.generate_until``
        reads it (the context's padded length, then the new tokens)."""
        if kwargs.get("do_sample") or kwargs.get("temperature", 0.0) > 0.0:
            raise UserError("fca eval generates greedily; the task asks for sampling (do_sample / temperature)")
        mask = kwargs.get("attention_mask")
        new_tokens = max_length - context.shape[1]
        rows = []
        for index, row in enumerate(context):
            ids = row[mask[index].bool()] if mask is not None else row
            generated = self.greedy(ids, new_tokens, stop)
            tail = generated + [self.tokenizer.pad_token_id] * (new_tokens - len(generated))
            rows.append(torch.cat([row, torch.tensor(tail, dtype=row.dtype, device=row.device)]))
        return torch.stack(rows)

    def greedy(self, ids: torch.Tensor, new_tokens: int, stop: list[str]) -> list[int]:
        """Up to ``new_tokens`` greedy tokens after ``ids``, ending at the end-of-text token or a stop string."""
        generated: list[int] = []
        for _ in range(new_tokens):
            window = torch.cat([ids, torch.tensor(generated, dtype=ids.dtype, device=ids.device)])
            token = int(self._model_call(window[-self.max_length :][None])[0, -1].argmax())
            generated.append(token)
            text = self.tok_decode(generated)
            if token == self.eot_token_id or any(s in text for s in stop):
                break
        return generated
