"""Dense: a pre-LayerNorm decoder-only Transformer (causal self-attention + GELU MLP), nanoGPT-style.

It has no controller; it is the shape-matched baseline that FeatureGate's latency is compared with, and
its attention/MLP/block modules are reused by FeatureGate so the two differ only by the gates.
"""

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from fca_workbench.models.common import CoefficientLMOutput, CoefficientModel, execution_device


class DenseConfig(PretrainedConfig):
    model_type = "fca-dense"

    def __init__(
        self,
        vocab_size: int = 4096,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 96,
        block_size: int = 256,
        mlp_ratio: int = 4,
        initializer_range: float = 0.02,
        tie_word_embeddings: bool = True,
        **kwargs: Any,
    ):
        if n_embd % n_head:
            raise ValueError(f"n_embd={n_embd} is not divisible by n_head={n_head}")
        self.vocab_size = vocab_size
        self.n_layer = n_layer
        self.n_head = n_head
        self.n_embd = n_embd
        self.block_size = block_size
        self.mlp_ratio = mlp_ratio
        self.initializer_range = initializer_range
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)  # type: ignore[call-arg]  # a config kwarg the stubs omit

    @classmethod
    def from_sizes(
        cls, vocab_size: int, layers: int, width: int, heads: int, window: int, gate_groups: int | None = None
    ) -> "DenseConfig":
        """The trainer's family-independent size knobs, in this family's field names."""
        return cls(vocab_size=vocab_size, n_layer=layers, n_embd=width, n_head=heads, block_size=window)

    def sizes(self) -> dict:
        """The inverse of ``from_sizes``: what a shape-matched model of another family needs."""
        return dict(
            vocab_size=self.vocab_size,
            layers=self.n_layer,
            width=self.n_embd,
            heads=self.n_head,
            window=self.block_size,
        )


def residual_projection(width_in: int, width_out: int, n_layer: int) -> nn.Linear:
    """GPT-2's scaled init of residual projections keeps the residual stream's scale depth-independent."""
    proj = nn.Linear(width_in, width_out)
    proj.init_scale = 1 / math.sqrt(2 * n_layer)  # type: ignore[assignment]  # a plain attribute, read by ``_init_weights``
    return proj


class CausalSelfAttention(nn.Module):
    def __init__(self, config: DenseConfig):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = residual_projection(config.n_embd, config.n_embd, config.n_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=2)
        q, k, v = (t.view(batch, length, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(batch, length, width))


class MLP(nn.Module):
    def __init__(self, config: DenseConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_ratio * config.n_embd)
        self.c_proj = residual_projection(config.mlp_ratio * config.n_embd, config.n_embd, config.n_layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    """``h + Attn(LN(h))`` then ``h + MLP(LN(h))``; the branches are methods so FeatureGate can gate them."""

    def __init__(self, config: DenseConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def attn_branch(self, h: torch.Tensor) -> torch.Tensor:
        return self.attn(self.ln_1(h))

    def mlp_branch(self, h: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.ln_2(h))

    def branches(self) -> list[nn.Module]:
        """The modules a block could skip per token (counted by the execution audit)."""
        return [self.attn, self.mlp]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attn_branch(h)
        return h + self.mlp_branch(h)


class GPTBackbone(CoefficientModel):
    """Embeddings, a stack of blocks, final norm and tied LM head: what Dense and FeatureGate share."""

    block_class: type[nn.Module] = Block
    _tied_weights_keys = {"lm_head.weight": "wte.weight"}

    def __init__(self, config: DenseConfig):
        super().__init__(config)
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.h = nn.ModuleList(self.block_class(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        """Normal init, scaled by a Linear's ``init_scale`` attribute (0 means zeros).

        Modules are visited children-first, so the scale must sit on the Linear itself, not its parent.
        """
        if not isinstance(module, nn.Linear):
            return super()._init_weights(module)
        scale = getattr(module, "init_scale", 1.0)
        nn.init.normal_(module.weight, mean=0.0, std=self.config.initializer_range * scale)
        if scale == 0:
            nn.init.zeros_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.wte

    def set_input_embeddings(self, value: nn.Embedding) -> None:  # type: ignore[override]  # an embedding table only
        self.wte = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.h)

    def latency_baseline(self) -> tuple[str, nn.Module]:
        """What latency is compared with: a shape-matched Dense with random weights."""
        return "dense", shape_matched_dense(self)

    @property
    def context_length(self) -> int:
        return self.config.block_size

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.wte(input_ids) + self.wpe(positions)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(h))

    # Explicit layer stepping (used by ``fca_workbench.audit.prefix``): ``embed`` gives the state before layer 0,
    # ``run_blocks`` continues from the state before any layer, ``head`` turns its output into logits. The
    # state before layer l is the residual stream ``h [B, T, d]``; the same ops as ``forward``, so
    # ``head(run_blocks(embed(x), 0, c)[0])`` equals ``forward(x, coefficients=c).logits`` bit for bit.

    def resume_layer(self, layer: int) -> int:
        """The first layer whose input state a change of ``coefficients[layer]`` can alter."""
        return layer

    def block_step(
        self, layer: int, h: torch.Tensor, coefficients: list[torch.Tensor] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run block ``layer`` on ``h``; returns the new state and the coefficient used (None: no controller)."""
        return self.h[layer](h), None

    def run_blocks(
        self, state: torch.Tensor, start: int, coefficients: list[torch.Tensor] | None = None, keep_states: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor] | None]:
        """Run blocks ``start .. n_layer-1`` from ``state`` (the state before layer ``start``).

        ``coefficients``: None (controllers run) or the full per-layer list, as for ``forward``; entries
        before ``start`` are not read. Returns ``(output, used, states)``: the input of ``head``, the
        coefficients used at layers ``start..`` and, with ``keep_states``, the states before layers
        ``start .. n_layer`` (the last one is the final state), else None.
        """
        if not 0 <= start <= len(self.h):
            raise ValueError(f"start layer {start} is out of range 0..{len(self.h)}")
        h, used = state, []
        states = [state] if keep_states else None
        for layer in range(start, len(self.h)):
            h, coefficient = self.block_step(layer, h, coefficients)
            if coefficient is not None:
                used.append(coefficient)
            if states is not None:
                states.append(h)
        return h, used, states


class DenseForCausalLM(GPTBackbone):
    config_class = DenseConfig
    arch = "dense"

    def forward(
        self,
        input_ids: torch.Tensor,
        coefficients: list[torch.Tensor] | None = None,
        return_coefficients: bool = False,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> CoefficientLMOutput:
        self.check_inputs(input_ids, coefficients)
        h = self.embed(input_ids)
        for block in self.h:
            h = block(h)
        return self.lm_output(self.head(h), input_ids, labels, [], return_coefficients)


def shape_matched_dense(model: CoefficientModel) -> DenseForCausalLM:
    """A randomly initialised Dense with the model's vocab, depth, width, heads and context.

    Latency only depends on shapes, so random weights are enough; it lands on the model's device and dtype.
    """
    parameter = next(model.parameters())  # its dtype (a placed model's weights may be on meta, not its device)
    sizes: Any = model.config.sizes  # every native family's config has ``sizes``
    dense = DenseForCausalLM(DenseConfig.from_sizes(**sizes()))
    return dense.to(device=execution_device(model), dtype=parameter.dtype).eval()  # type: ignore[call-arg]  # wrapped ``to``
