"""MUDDPythia: Pythia with MUltiway Dynamic Dense (MUDD) connections.

A re-implementation of the public reference, github.com/Caiyun-AI/MUDDFormer ``pytorch/muddpythia/``
(``modeling_muddpythia.py`` and ``configuration_muddpythia.py`` at commit fc067b2), written so the
official Hugging Face checkpoints (MUDDPythia-1.4B / -2.8B) load into it strictly, without
``trust_remote_code``. Per layer i, with ``hiddens = [x_0, ..., x_{i+1}]`` (embeddings, then every layer
output so far):

    x_{i+1} = layers[i](q, k, v, r)                          # one block, fed by four input streams
    A_i     = dynamic_dense[i](x_{i+1}) + dense_bs[i]        # [B, T, C, i+2]: the complete coefficient
    stream_c = sum_j A_i[:, :, c, j] * hiddens[j]            # c over (q, k, v, r); C = 1 on the last layer

Layer 0 reads the embeddings as all four streams; the last layer's single stream goes to the final norm and
the LM head. Inside a block the q/k/v streams each get their own LayerNorm (``attention_norms``, "sepln")
before ``wq``/``wk``/``wv``; ``r`` is the residual, and with ``use_parallel_residual`` the FFN reads
``ffn_norm(r)``: ``out = r + Attn(...) + FFN(ffn_norm(r))``. FFN widths grow with depth (0.5x to 1.5x of
``intermediate_size``, rounded to 128).

The coefficient seam: ``dynamic_dense[i]`` is layer i's controller. When ``coefficients`` is given, layer i
uses ``coefficients[i]`` as ``A_i`` and neither the controller nor the ``dense_bs`` add runs. Both paths hand
the same ``[B, T, C, L]`` tensor to ``mix_streams``, so replaying the model's own coefficients is bit-exact.

How faithfulness to the reference was matched (read line by line, then re-written):

* Parameter names and the module tree are the reference's own (no ``model.`` prefix, untied ``output``):
  ``tok_embeddings``, ``layers.{i}.attention.{wq,wk,wv,wo}`` (all with bias), ``...attention.{q_norm,k_norm}``,
  ``layers.0.attention_norm`` / ``layers.{i>0}.attention_norms.{0,1,2}``, ``layers.{i}.ffn_norm``,
  ``layers.{i}.feed_forward.{w1,w2}``, ``norm``, ``output``, ``dense_bs.{i}``, ``dynamic_dense.{i}.{w1,w2}``.
  The rotary table and causal mask are not parameters or buffers there, so they are not here either.
* Numerics follow the reference op for op: the rotary table is computed in fp32 and stored in **fp16**;
  rotation is applied in fp32 to the first ``int(head_dim * rotary_pct)`` channels pairing channel j with
  j + R/2 ("half" mode) and writing the pairs back interleaved (the reference's layout; q and k get the same
  permutation, so q·k is unchanged); q/k RMSNorm runs in fp32 before the rotary; attention is
  ``softmax(where(mask, q@kᵀ * d^-½, finfo(fp16).min))`` in the model dtype; the controller's RMSNorm has
  no scale and runs in the model dtype; GELUs are exact (erf); stream mixing is the same Python ``sum``
  over layers in the same order.
* Checked, not assumed: the reference's own modeling file, given this module's state dict with
  ``strict=True``, returns bit-identical logits in fp32 and bf16 (opt-in test, ``MUDDPYTHIA_REFERENCE``
  pointing at a copy of its folder), and the official 1.4B/2.8B configs give exactly its key names and
  shapes. Without the reference, ``tests/test_muddpythia.py`` re-computes the forward in a separately
  written functional form (complex-number rotary, einsum mixing) and checks the logits agree.

Deviations, all outside the numerics of a full-window forward: no KV/layer caches or ``generate`` (the
workbench scores whole windows); only the configuration the checkpoints use is built (dense, dynamic, or
static for ``fca export``; ``dense_type='qkvr'``, separate stream norms, unstacked hiddens), and others are
refused in the config;
the rotary table is built lazily per device instead of in ``setup_caches``; ``_init_weights`` gives a
from-scratch init (the reference is inference-only): controllers as in the official JAX trainer (``w1``
fan-in normal, ``w2`` zero, ``dense_bs`` one-hot on the newest layer, so training starts as a plain Pythia).
"""

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig
from transformers import initialization as init

from fca_workbench.models.common import CoefficientLMOutput, CoefficientModel
from fca_workbench.models.dense import shape_matched_dense

DENSE_STREAMS = "qkvr"  # the streams every layer but the last mixes for the next block (``dense_type``)


class MUDDPythiaConfig(PretrainedConfig):
    """The reference config: same field names, defaults and derived fields (``head_dim`` is recomputed)."""

    model_type = "muddpythia"

    def __init__(
        self,
        block_size: int = 2048,
        vocab_size: int = 32000,
        n_layer: int = 32,
        n_head: int = 32,
        dim: int = 2560,
        intermediate_size: int | None = None,
        n_local_heads: int = -1,
        head_dim: int = 64,
        rope_base: float = 10000,
        norm_eps: float = 1e-5,
        use_gradient_checkpointing: bool = False,
        is_training: bool = False,
        use_qk_norm: bool = False,
        pad_token_id: int | None = None,
        use_parallel_residual: bool = True,
        use_linear_bias: bool = True,
        rotary_pct: float = 0.25,
        bos_token_id: int = 1,
        eos_token_id: int = 2,
        tie_word_embeddings: bool = False,
        use_layer_cache: bool = True,
        stack_hidden: bool = False,
        dense: bool = True,
        dynamic_dense: bool = True,
        sepln: bool = True,
        dense_type: str = DENSE_STREAMS,
        expand_last: bool = False,
        round64: bool = False,
        **kwargs: Any,
    ):
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.n_layer = n_layer
        self.n_head = n_head
        self.dim = dim
        self.n_local_heads = n_head if n_local_heads == -1 else n_local_heads
        self.intermediate_size = 4 * dim if intermediate_size is None else intermediate_size
        self.head_dim = dim // n_head  # the reference always derives it, whatever was passed
        self.rope_base = rope_base
        self.norm_eps = norm_eps
        self.use_gradient_checkpointing = use_gradient_checkpointing  # kept for round trips; unused
        self.is_training = is_training  # kept for round trips; only switched caches in the reference
        self.use_qk_norm = use_qk_norm
        self.use_parallel_residual = use_parallel_residual
        self.use_linear_bias = use_linear_bias
        self.rotary_pct = rotary_pct
        self.use_layer_cache = use_layer_cache  # kept for round trips; there is no decode cache here
        self.stack_hidden = stack_hidden
        self.dense = dense
        self.dynamic_dense = dynamic_dense
        self.sepln = sepln
        self.dense_type = dense_type
        self.expand_last = expand_last
        self.round64 = round64
        self._check(tie_word_embeddings)
        super().__init__(  # type: ignore[call-arg]  # config kwargs the stubs omit
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )

    @classmethod
    def from_sizes(
        cls, vocab_size: int, layers: int, width: int, heads: int, window: int, gate_groups: int | None = None
    ) -> "MUDDPythiaConfig":
        """The trainer's family-independent size knobs, in the reference's field names."""
        return cls(vocab_size=vocab_size, n_layer=layers, dim=width, n_head=heads, block_size=window)

    def sizes(self) -> dict:
        return dict(
            vocab_size=self.vocab_size, layers=self.n_layer, width=self.dim, heads=self.n_head, window=self.block_size
        )

    def _check(self, tie_word_embeddings: bool) -> None:
        """Refuse configs this module does not build, instead of silently computing something else."""
        problems = []
        if self.dense_type != DENSE_STREAMS:
            problems.append(f"dense_type={self.dense_type!r} (only 'qkvr', the four q/k/v/r streams)")
        if not self.dense:
            problems.append("dense=False (the layer mix is what a MUDDPythia is)")
        if not self.sepln:
            problems.append("sepln=False (the q/k/v streams need their own LayerNorms)")
        if self.stack_hidden:
            problems.append("stack_hidden=True (only the unstacked layer mix is built)")
        if tie_word_embeddings:
            problems.append("tie_word_embeddings=True (MUDDPythia never ties tok_embeddings and output)")
        if self.n_layer < 2:
            problems.append(f"n_layer={self.n_layer} (the FFN width schedule needs at least 2 layers)")
        if self.dim % self.n_head:
            problems.append(f"dim={self.dim} is not divisible by n_head={self.n_head}")
        if self.n_local_heads != self.n_head:
            problems.append(f"n_local_heads={self.n_local_heads} != n_head={self.n_head} (no grouped-query attention)")
        rotary = int(self.head_dim * self.rotary_pct)
        if rotary < 2 or rotary % 2:
            problems.append(f"rotary dims int(head_dim*rotary_pct)={rotary} must be even and at least 2")
        if problems:
            raise ValueError("not a MUDDPythia config this workbench can build: " + "; ".join(problems))


# ----------------------------------------------------------------------------------------------------------
# small pieces


class RMSnormNoscale(nn.Module):
    """The controller's input norm: RMS-normalise in the model dtype, no learned scale (no parameters)."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)


class RMSNorm(nn.Module):
    """q/k norm over ``head_dim``: normalise in fp32, cast back, then scale (the reference's order)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def precompute_rope(seq_len: int, n_elem: int, base: float, device: torch.device | str | None = None) -> torch.Tensor:
    """``[seq_len, n_elem/2, 2]`` (cos, sin), computed in fp32 and stored in fp16 as the reference does."""
    freqs = 1.0 / (base ** (torch.arange(0, n_elem, 2, device=device)[: n_elem // 2].float() / n_elem))
    angles = torch.outer(torch.arange(seq_len, device=device), freqs)
    rotations = torch.polar(torch.ones_like(angles), angles)
    return torch.stack([rotations.real, rotations.imag], dim=-1).to(torch.float16)


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, T, H, R]`` in fp32: channel j pairs with j + R/2; pairs come back interleaved."""
    pairs = x.float().reshape(*x.shape[:-1], 2, -1).transpose(-1, -2)  # [B, T, H, R/2, 2]
    rope = rope.view(1, pairs.size(1), 1, pairs.size(3), 2)
    cos, sin = rope[..., 0], rope[..., 1]
    rotated = torch.stack(
        [pairs[..., 0] * cos - pairs[..., 1] * sin, pairs[..., 1] * cos + pairs[..., 0] * sin], dim=-1
    )
    return rotated.flatten(3).type_as(x)


def ffn_width(config: MUDDPythiaConfig, lidx: int) -> int:
    """Per-layer FFN width: ``intermediate_size`` scaled 0.5x (first) to 1.5x (last), rounded to 128."""
    width = config.intermediate_size * (lidx / (config.n_layer - 1) + 0.5)
    return round(width / 128) * 128


def controller_width(config: MUDDPythiaConfig, lidx: int) -> int:
    """Hidden width of layer lidx's controller: C·L, x4 on the last layer if ``expand_last``, ``round64``."""
    last = lidx == config.n_layer - 1
    width = stream_count(config, lidx) * (lidx + 2)
    if last and config.expand_last:
        width *= 4
    if config.round64:
        width = (width // 64 + 1) * 64  # always rounds up past a multiple of 64, as the reference does
    return width


def stream_count(config: MUDDPythiaConfig, lidx: int) -> int:
    """C: four streams (q, k, v, r) feed the next block; the last layer feeds only the LM head."""
    return 1 if lidx == config.n_layer - 1 else len(config.dense_type)


def mix_streams(hiddens: list[torch.Tensor], coefficient: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``stream_c = sum_j A[:, :, c, j] * hiddens[j]``; ``A`` is ``[B, T, C, L]`` with L = len(hiddens)."""
    return tuple(
        sum(coefficient[:, :, c, j, None] * hidden for j, hidden in enumerate(hiddens))  # type: ignore[misc]
        for c in range(coefficient.shape[2])
    )


# ----------------------------------------------------------------------------------------------------------
# modules


class MultiwayDynamicDenseBlock(nn.Module):
    """Layer lidx's controller: ``w2(gelu(w1(rmsnorm(x))))`` -> ``[B, T, C, lidx+2]`` (without ``dense_bs``)."""

    def __init__(self, config: MUDDPythiaConfig, lidx: int):
        super().__init__()
        self.C = stream_count(config, lidx)
        self.L = lidx + 2
        hidden = controller_width(config, lidx)
        self.norm = RMSnormNoscale(config.norm_eps)
        self.w1 = nn.Linear(config.dim, hidden, bias=False)
        self.act = nn.GELU()
        self.w2 = nn.Linear(hidden, self.C * self.L, bias=False)
        self.w1.init_std = config.dim**-0.5  # read by _init_weights: fan-in normal, as the JAX trainer
        self.w2.init_std = 0.0  # type: ignore[assignment]  # read by _init_weights: starts silent (dense_bs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dw = self.w2(self.act(self.w1(self.norm(x))))
        return dw.unflatten(-1, (self.C, self.L))  # the reference's '(C L)' split, kept batch-first


class Attention(nn.Module):
    """Causal attention whose q, k and v read three different (already normed) streams."""

    def __init__(self, config: MUDDPythiaConfig, lidx: int):
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.dim = config.dim
        self.wq = nn.Linear(config.dim, config.n_head * config.head_dim, bias=True)
        self.wk = nn.Linear(config.dim, config.n_local_heads * config.head_dim, bias=True)
        self.wv = nn.Linear(config.dim, config.n_local_heads * config.head_dim, bias=True)
        self.wo = nn.Linear(config.dim, config.dim, bias=True)
        self.wo.init_scale = 1 / math.sqrt(2 * config.n_layer)  # type: ignore[assignment]  # read by _init_weights
        self.scale_factor = 1 / math.sqrt(self.head_dim)
        self.rotary_ndims = int(self.head_dim * config.rotary_pct)
        self.use_qk_norm = config.use_qk_norm
        if self.use_qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.norm_eps)

    def forward(
        self, xq: torch.Tensor, xk: torch.Tensor, xv: torch.Tensor, rope: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        batch, length, _ = xq.shape
        q = self.wq(xq).view(batch, length, self.n_head, self.head_dim)
        k = self.wk(xk).view(batch, length, -1, self.head_dim)
        v = self.wv(xv).view(batch, length, -1, self.head_dim)
        if self.use_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        r = self.rotary_ndims
        q = torch.cat((apply_rope(q[..., :r], rope), q[..., r:]), dim=-1)
        k = torch.cat((apply_rope(k[..., :r], rope), k[..., r:]), dim=-1)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) * self.scale_factor
        scores = torch.where(mask, scores, torch.finfo(torch.float16).min)  # the reference's mask value
        y = scores.softmax(-1) @ v
        return self.wo(y.transpose(1, 2).contiguous().view(batch, length, self.dim))


class FeedForward(nn.Module):
    def __init__(self, config: MUDDPythiaConfig, lidx: int):
        super().__init__()
        width = ffn_width(config, lidx)
        self.w1 = nn.Linear(config.dim, width, bias=config.use_linear_bias)
        self.w2 = nn.Linear(width, config.dim, bias=config.use_linear_bias)
        self.w2.init_scale = 1 / math.sqrt(2 * config.n_layer)  # type: ignore[assignment]  # read by _init_weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.gelu(self.w1(x)))


class TransformerBlock(nn.Module):
    """Pythia block on four streams: ``r + Attn(LN_q(q), LN_k(k), LN_v(v)) + FFN(ffn_norm(r))``."""

    def __init__(self, config: MUDDPythiaConfig, lidx: int):
        super().__init__()
        self.lidx = lidx
        self.attention = Attention(config, lidx)
        self.feed_forward = FeedForward(config, lidx)
        self.ffn_norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.use_parallel_residual = config.use_parallel_residual
        if lidx > 0:  # layer 0 reads one stream (the embeddings), so it has a single norm
            self.attention_norms = nn.ModuleList(nn.LayerNorm(config.dim, eps=config.norm_eps) for _ in range(3))
        else:
            self.attention_norm = nn.LayerNorm(config.dim, eps=config.norm_eps)

    def branches(self) -> list[nn.Module]:
        """The modules a block could skip per token (counted by the execution audit)."""
        return [self.attention, self.feed_forward]

    def forward(
        self, streams: torch.Tensor | tuple[torch.Tensor, ...], rope: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        if self.lidx == 0:
            res = streams
            xq = xk = xv = self.attention_norm(streams)
        else:
            res = streams[-1]
            xq, xk, xv = (norm(x) for norm, x in zip(self.attention_norms, streams[:3]))
        h = res + self.attention(xq, xk, xv, rope, mask)
        return h + self.feed_forward(self.ffn_norm(res if self.use_parallel_residual else h))


class MUDDPythiaForCausalLM(CoefficientModel):
    """The reference ``MUDDPythia`` with the coefficient seam; state-dict keys are the checkpoint's."""

    config_class = MUDDPythiaConfig
    config: MUDDPythiaConfig
    arch = "muddpythia"
    _no_split_modules = ["TransformerBlock"]
    # decode caches the reference can attach at inference; never weights, so a checkpoint holding them loads
    _keys_to_ignore_on_load_unexpected = [r"\.kv_cache\.", r"^layer_cache\."]

    def __init__(self, config: MUDDPythiaConfig):
        super().__init__(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(TransformerBlock(config, i) for i in range(config.n_layer))
        self.norm = nn.LayerNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        self.dense_bs = nn.ParameterList(
            nn.Parameter(torch.empty(stream_count(config, i), i + 2)) for i in range(config.n_layer)
        )
        # ``dynamic_dense=False``: a static cross-layer model, ``A_i = dense_bs[i]`` for every token (``fca export``)
        self.dynamic_dense = nn.ModuleList(
            MultiwayDynamicDenseBlock(config, i) for i in range(config.n_layer if config.dynamic_dense else 0)
        )
        self.rotary_ndims = int(config.head_dim * config.rotary_pct)
        self._rope_tables: dict[torch.device, torch.Tensor] = {}  # not state: rebuilt per device on demand
        self.post_init()

    def _init_weights(self, module):
        """From-scratch init (the reference ships none): normal(0.02) with GPT-2 residual scaling, norms at
        identity, controllers silent and ``dense_bs`` one-hot on the newest layer (the JAX trainer's init)."""
        std = getattr(self.config, "initializer_range", 0.02)
        if isinstance(module, nn.Linear):
            weight_std = getattr(module, "init_std", std * getattr(module, "init_scale", 1.0))
            if weight_std == 0:
                init.zeros_(module.weight)
            else:
                init.normal_(module.weight, mean=0.0, std=weight_std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            init.ones_(module.weight)
        elif module is self.dense_bs:  # here, not on the model: v5 skips modules without own parameters
            for bias in module:
                newest_only = torch.zeros_like(bias)
                newest_only[:, -1] = 1.0
                init.copy_(bias, newest_only)

    def get_input_embeddings(self) -> nn.Embedding:
        return self.tok_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:  # type: ignore[override]  # an embedding table only
        self.tok_embeddings = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.output

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def latency_baseline(self) -> tuple[str, nn.Module]:
        """What latency is compared with: a shape-matched Dense with random weights."""
        return "dense", shape_matched_dense(self)

    @property
    def controllers(self) -> list[nn.Module]:
        return list(self.dynamic_dense)

    @property
    def coefficient_slot_shapes(self) -> list[tuple[int, ...]]:
        return [(stream_count(self.config, i), i + 2) for i in range(len(self.dynamic_dense))]

    @classmethod
    def slot_labels_for(cls, slot_shape: tuple[int, ...]) -> list[str]:
        """``stream←xj``: the weight of hidden state ``x_j`` (``x0`` the embeddings, ``xj`` block j-1's output)
        in each stream the layer mixes: ``q``/``k``/``v``/``r`` for the next block, ``out`` for the head (the
        last layer)."""
        streams, sources = slot_shape
        names = ("out",) if streams == 1 else DENSE_STREAMS
        return [f"{names[c]}←x{j}" for c in range(streams) for j in range(sources)]

    @property
    def context_length(self) -> int:
        return self.config.block_size

    def rope_table(self, length: int, device: torch.device) -> torch.Tensor:
        """The first ``length`` rows of the ``block_size`` table (built once per device, like the reference)."""
        if device not in self._rope_tables:
            self._rope_tables[device] = precompute_rope(
                self.config.block_size, self.rotary_ndims, self.config.rope_base, device=device
            )
        return self._rope_tables[device][:length]

    # Explicit layer stepping (used by ``fca_workbench.audit.prefix``). Because of the dense connections, the state
    # before layer l is the list of every hidden state so far, ``[x_0, ..., x_l]`` (embeddings first); the
    # q/k/v/r streams of layer l are re-mixed from it with ``A_{l-1}``. ``run_blocks`` repeats ``forward``'s
    # ops in the same order, so ``head(run_blocks(embed(x), 0, c)[0])`` equals ``forward``'s logits exactly.

    def resume_layer(self, layer: int) -> int:
        """The first layer whose input state a change of ``coefficients[layer]`` can alter: ``A_layer`` only
        mixes outputs that already exist after block ``layer``, so the state before ``layer + 1`` is unchanged."""
        return layer + 1

    def embed(self, input_ids: torch.Tensor) -> list[torch.Tensor]:
        return [self.tok_embeddings(input_ids)]

    def head(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(x))

    def complete_coefficient(
        self, layer: int, x: torch.Tensor, coefficients: list[torch.Tensor] | None
    ) -> torch.Tensor:
        """``A_layer``: given, or the controller's output on block ``layer``'s output plus ``dense_bs`` (a static
        model: ``dense_bs`` alone, for every token)."""
        if coefficients is not None:
            return coefficients[layer]
        if not self.config.dynamic_dense:
            return self.dense_bs[layer].expand(*x.shape[:2], *self.dense_bs[layer].shape)
        return self.dynamic_dense[layer](x) + self.dense_bs[layer]

    def run_blocks(
        self,
        state: list[torch.Tensor],
        start: int,
        coefficients: list[torch.Tensor] | None = None,
        keep_states: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor], list[list[torch.Tensor]] | None]:
        """Run layers ``start .. n_layer-1`` from ``state = [x_0, ..., x_start]``.

        ``coefficients``: None (controllers run) or the full per-layer list; ``coefficients[start-1]`` mixes
        the streams of layer ``start``. Returns ``(output, used, states)`` as the GPT families do: the input
        of ``head``, the coefficients of layers ``start..`` and, with ``keep_states``, the states before
        layers ``start .. n_layer``.
        """
        n_layer = len(self.layers)
        hiddens = list(state)
        if not 0 <= start <= n_layer or len(hiddens) != start + 1:
            raise ValueError(f"the state before layer {start} holds {start + 1} hidden states, got {len(hiddens)}")
        length, device = hiddens[0].shape[1], hiddens[0].device
        rope = self.rope_table(length, device)
        mask = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        streams: torch.Tensor | tuple[torch.Tensor, ...]
        if start == 0:
            streams = hiddens[0]
        else:
            streams = mix_streams(hiddens, self.complete_coefficient(start - 1, hiddens[-1], coefficients))
        used = []
        states = [list(hiddens)] if keep_states else None
        for i in range(start, n_layer):
            x = self.layers[i](streams, rope, mask)
            hiddens.append(x)
            coefficient = self.complete_coefficient(i, x, coefficients)
            used.append(coefficient)
            streams = mix_streams(hiddens, coefficient)
            if states is not None:
                states.append(list(hiddens))
        return streams[0], used, states

    def forward(
        self,
        input_ids: torch.Tensor,
        coefficients: list[torch.Tensor] | None = None,
        return_coefficients: bool = False,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> CoefficientLMOutput:
        self.check_inputs(input_ids, coefficients)
        attention_mask = kwargs.get("attention_mask")
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("MUDDPythia scores whole windows; padded attention masks are not supported")
        length = input_ids.shape[1]
        rope = self.rope_table(length, input_ids.device)
        mask = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()

        x = self.tok_embeddings(input_ids)
        hiddens, streams, used = [x], x, []
        for i, layer in enumerate(self.layers):
            x = layer(streams, rope, mask)
            hiddens.append(x)
            coefficient = self.complete_coefficient(i, x, coefficients)  # [B, T, C, i+2]
            used.append(coefficient)
            streams = mix_streams(hiddens, coefficient)
        logits = self.output(self.norm(streams[0]))
        return self.lm_output(logits, input_ids, labels, used, return_coefficients)
