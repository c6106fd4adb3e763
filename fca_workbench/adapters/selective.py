"""Selective SSMs, gated linear attention, attention output gates and other input-dependent gates as
controllers, found by what they are (the modules and attributes that compute them), not by a class name.

Each role below looks at one module (the owner: a Mamba mixer, a gated DeltaNet, an xLSTM layer) and names the
child projections whose output is input-dependent control, with the columns that are: the coefficient is
exactly the input-dependent part. Where a projection also makes content (Mamba2's ``in_proj`` makes the output
gate z and the input x beside B, C and Δ; Qwen3-Next's ``q_proj`` makes the queries beside the output gate),
a ``ColumnKind`` keeps only the control columns; on replay the projection runs live and its control columns
are overwritten, so the content follows the input while the control is frozen.

What is not a controller here: output gates of linear attention (Mamba2's z, a DeltaNet's z / g) gate content
the way a SwiGLU gate does, and stay live; a value computed from a controller's output by fixed parameters
(Mamba's Δ = softplus(dt_proj(·)), a causal depthwise convolution of B and C) is frozen with it.

The roles read the model in eval mode, where every family below calls these projections as modules on CPU and
CUDA alike (the fused training kernels, which take the weights instead, run only under ``model.train()``).
"""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fca_workbench.adapters.families import (
    ALTUP_ROUTER,
    ATTENTION_OUTPUT_GATE,
    CONV_GATE,
    DELTA_RULE_GATE,
    DYNAMIC_CONV,
    LSTM_GATE,
    SELECTIVE_GATE,
    SELECTIVE_SSM,
)
from fca_workbench.adapters.kinds import ControllerKind
from fca_workbench.adapters.protocol import COEFFICIENT
from fca_workbench.foundation.errors import UserError
from fca_workbench.models.common import index_slot_labels

Span = tuple[str, int, int]  # a labelled run of output columns: (label, start, stop)


def _never(name: str, module: nn.Module) -> bool:
    return False  # found by role (``selective_controllers``), never by a module alone


def _span_labels(spans: tuple[Span, ...]) -> Callable[[tuple[int, ...]], list[str]]:
    def labels(slot_shape: tuple[int, ...]) -> list[str]:
        return [f"{label} {i}" for label, start, stop in spans for i in range(stop - start)]

    return labels


def _whole_values(output, batch_first) -> dict:
    if not isinstance(output, torch.Tensor):
        raise UserError(f"returns a {type(output).__name__}, not a tensor; the adapter cannot use it")
    return {COEFFICIENT: batch_first(output)}


def _whole_output(values, lead):
    coefficient = values[COEFFICIENT]
    return coefficient.reshape(*lead, *coefficient.shape[2:])


@dataclass(frozen=True)
class ColumnKind(ControllerKind):
    """A controller that is some columns (``spans``) of a projection's output: ``to_values`` keeps those
    columns; ``to_output(values, lead, live)`` is the live output with them overwritten by the values."""

    spans: tuple[Span, ...] = ()


def _column_values(spans: tuple[Span, ...]) -> Callable:
    def to_values(output, batch_first) -> dict:
        parts = _whole_values(output, batch_first)[COEFFICIENT]
        return {COEFFICIENT: torch.cat([parts[..., start:stop] for _, start, stop in spans], dim=-1)}

    return to_values


def _column_output(spans: tuple[Span, ...]) -> Callable:
    def to_output(values, lead, live: torch.Tensor) -> torch.Tensor:
        coefficient = values[COEFFICIENT].reshape(*lead, -1).to(live.dtype)
        output = live.clone() if torch.is_grad_enabled() else live  # the projection's own fresh output
        offset = 0
        for _, start, stop in spans:
            output[..., start:stop] = coefficient[..., offset : offset + stop - start]
            offset += stop - start
        return output

    return to_output


def projection_kind(name: str, width: int, spans: tuple[Span, ...]) -> ControllerKind:
    """The kind of a projection of ``width`` output columns whose ``spans`` are control: a whole-output kind
    (the projection never runs on replay) when they cover every column, else a ``ColumnKind``."""
    covered = sorted((start, stop) for _, start, stop in spans)
    if covered[0][0] == 0 and covered[-1][1] == width and all(a[1] == b[0] for a, b in zip(covered, covered[1:])):
        return ControllerKind(name, _never, _whole_values, _whole_output, slot_labels=_span_labels(spans))
    return ColumnKind(
        name, _never, _column_values(spans), _column_output(spans), slot_labels=_span_labels(spans), spans=spans
    )


def whole_kind(name: str, slot_labels: Callable[[tuple[int, ...]], list[str]] = index_slot_labels) -> ControllerKind:
    """A child module whose whole output is control (a gate's own projection)."""
    return ControllerKind(name, _never, _whole_values, _whole_output, slot_labels=slot_labels)


Found = list[tuple[str, nn.Module, ControllerKind]]  # (attribute, controller module, kind) of one owner
Role = Callable[[nn.Module], Found]


def _linear(owner: nn.Module, attr: str) -> nn.Linear | None:
    child = getattr(owner, attr, None)
    return child if isinstance(child, nn.Linear) else None


def _sizes(owner: nn.Module, *names: str) -> list[int] | None:
    """The owner's integer attributes ``names`` (a mixer's sizes), or None when one is missing."""
    values = [vars(owner).get(name) for name in names]
    return [v for v in values if isinstance(v, int)] if all(isinstance(v, int) for v in values) else None


def mamba_role(owner: nn.Module) -> Found:
    """Mamba, FalconMamba, Jamba's mamba layers: ``x_proj``'s output is (Δ's low-rank input, B, C), all of it."""
    x_proj, sizes = _linear(owner, "x_proj"), _sizes(owner, "time_step_rank", "ssm_state_size")
    if x_proj is None or sizes is None or _linear(owner, "dt_proj") is None or not hasattr(owner, "A_log"):
        return []
    rank, state = sizes
    spans = (("dt", 0, rank), ("B", rank, rank + state), ("C", rank + state, rank + 2 * state))
    return [("x_proj", x_proj, projection_kind(SELECTIVE_SSM, x_proj.out_features, spans))]


def mamba2_role(owner: nn.Module) -> Found:
    """Mamba2 and its hybrids (Bamba, FalconH1, Zamba2, NemotronH, GraniteMoeHybrid): ``in_proj`` makes
    (z, x, B, C, Δ); the last ``2·G·N + H`` columns are B, C (before their depthwise causal convolution,
    which keeps channels apart) and Δ."""
    in_proj, sizes = _linear(owner, "in_proj"), _sizes(owner, "n_groups", "ssm_state_size", "num_heads")
    if in_proj is None or sizes is None or not (hasattr(owner, "dt_bias") and hasattr(owner, "A_log")):
        return []
    groups, state, heads = sizes
    groups_state = groups * state
    start = in_proj.out_features - heads - 2 * groups_state
    spans = (
        ("B", start, start + groups_state),
        ("C", start + groups_state, start + 2 * groups_state),
        ("dt", start + 2 * groups_state, in_proj.out_features),
    )
    return [("in_proj", in_proj, projection_kind(SELECTIVE_SSM, in_proj.out_features, spans))]


DELTA_GATE_ATTRS = ("in_proj_ba", "in_proj_b", "in_proj_a", "b_proj", "a_proj", "forget_gate")


def delta_rule_role(owner: nn.Module) -> Found:
    """Gated DeltaNet (Qwen3-Next, Qwen3.5, OLMo-hybrid) and Kimi delta attention (Kimi-Linear,
    Bailing-hybrid): the projections of the decay and of β."""
    if not type(owner).__name__.endswith(("GatedDeltaNet", "DeltaAttention")):
        return []
    children = [(attr, getattr(owner, attr, None)) for attr in DELTA_GATE_ATTRS]
    return [(attr, child, whole_kind(DELTA_RULE_GATE)) for attr, child in children if isinstance(child, nn.Module)]


def attention_gate_role(owner: nn.Module) -> Found:
    """Softmax attention with an output gate: a separate ``g_proj`` (Bailing-hybrid), or the second half of
    each head's ``q_proj`` output (Qwen3-Next, Qwen3.5: ``q_proj`` makes ``2 × head_dim`` per head)."""
    name = type(owner).__name__
    if not name.endswith("Attention") or name.endswith("DeltaAttention") or _linear(owner, "o_proj") is None:
        return []
    g_proj = _linear(owner, "g_proj")
    if g_proj is not None:
        return [("g_proj", g_proj, whole_kind(ATTENTION_OUTPUT_GATE))]
    q_proj, head_dim = _linear(owner, "q_proj"), getattr(owner, "head_dim", None)
    heads = getattr(getattr(owner, "config", None), "num_attention_heads", None)
    if q_proj is None or not isinstance(head_dim, int) or not isinstance(heads, int):
        return []
    if q_proj.out_features != 2 * head_dim * heads:
        return []
    spans = tuple((f"head {h} gate", (2 * h + 1) * head_dim, (2 * h + 2) * head_dim) for h in range(heads))
    return [("q_proj", q_proj, projection_kind(ATTENTION_OUTPUT_GATE, q_proj.out_features, spans))]


def fused_query_gate_role(owner: nn.Module) -> Found:
    """Attention whose query projection makes each head's query and output gate side by side (``q_gate_proj``:
    per head ``qk_head_dim`` query columns, then ``v_head_dim`` gate columns, as AXK2's multi-head latent
    attention; ``head_dim`` of each where the attention names one head width, as MiniCPM5-MoE's)."""
    q_gate, head = _linear(owner, "q_gate_proj"), _sizes(owner, "head_dim")
    sizes = _sizes(owner, "qk_head_dim", "v_head_dim") or (head * 2 if head else None)
    if q_gate is None or sizes is None:
        return []
    query, gate = sizes
    heads, remainder = divmod(q_gate.out_features, query + gate)
    if remainder:
        return []
    spans = tuple((f"head {h} gate", h * (query + gate) + query, (h + 1) * (query + gate)) for h in range(heads))
    return [("q_gate_proj", q_gate, projection_kind(ATTENTION_OUTPUT_GATE, q_gate.out_features, spans))]


def gated_output_role(owner: nn.Module) -> Found:
    """Inkling2's attention output projection, which gates the attention output by a sigmoid of
    ``gate_proj`` of the layer input."""
    gate = _linear(owner, "gate_proj")
    if not type(owner).__name__.endswith("GatedOutputProjection") or gate is None:
        return []
    return [("gate_proj", gate, whole_kind(ATTENTION_OUTPUT_GATE))]


def dynamic_conv_role(owner: nn.Module) -> Found:
    """Inkling2's dynamic short convolution: ``weight_proj`` makes each token's convolution kernel."""
    weight_proj = _linear(owner, "weight_proj")
    if not type(owner).__name__.endswith("DynamicShortConvolution") or weight_proj is None:
        return []
    return [("weight_proj", weight_proj, whole_kind(DYNAMIC_CONV))]


def lstm_gate_role(owner: nn.Module) -> Found:
    """xLSTM's mLSTM layer: the input and forget gate pre-activations (separate, or fused in one projection)."""
    if not type(owner).__name__.endswith(("xLSTMLayer", "mLSTMLayer")):  # the latter: the xlstm package's
        return []
    attrs = ("igate_preact", "fgate_preact", "ifgate_preact")
    children = [(attr, _linear(owner, attr)) for attr in attrs]
    return [(attr, child, whole_kind(LSTM_GATE)) for attr, child in children if child is not None]


def conv_gate_role(owner: nn.Module) -> Found:
    """LFM2's gated short convolution: ``in_proj`` makes (B, C, x); B gates the convolution's input, C its
    output."""
    in_proj = _linear(owner, "in_proj")
    if not type(owner).__name__.endswith("ShortConv") or in_proj is None:
        return []
    third = in_proj.out_features // 3
    spans = (("B", 0, third), ("C", third, 2 * third))
    return [("in_proj", in_proj, projection_kind(CONV_GATE, in_proj.out_features, spans))]


def altup_role(owner: nn.Module) -> Found:
    """Gemma3n's AltUp: its router runs twice per layer (predict, correct), and each of its two outputs feeds
    one projection that runs once: the prediction and the correction coefficients, two controllers."""
    if not type(owner).__name__.endswith("AltUp") or _linear(owner, "modality_router") is None:
        return []
    return [(attr, getattr(owner, attr), whole_kind(ALTUP_ROUTER)) for attr in ("prediction_coefs", "correction_coefs")]


class ParameterGate(nn.Module):
    """An owner's expression of its gate parameter and the activations (a gate weight's product with the
    input; a learned query's weights over stacked states), as a module of its own, so that hooks record it
    and replay replaces it: ``op(owner, *inputs)`` is the owner's own expression. The owner is held outside
    the module tree (the gate owns no parameter; the model's modules are unchanged), and the module's inputs
    are the activations."""

    def __init__(self, owner: nn.Module, op: Callable[..., torch.Tensor]):
        super().__init__()
        self._owner = [owner]
        self.op = op

    def forward(self, *inputs: Any) -> torch.Tensor:
        return self.op(self._owner[0], *inputs)


class GateWeight:
    """Stands in for a gate weight on its owner (an instance attribute shadows the parameter, which stays
    in the state dict), so the owner's forward, where it multiplies by the weight, calls the ``gate`` module
    instead: ``torch.baddbmm(bias, x, weight)`` (``__torch_function__``; the gate adds the owner's bias
    itself) or ``weight[:, None] @ x``."""

    def __init__(self, gate: ParameterGate, indexed: bool = False, as_float: bool = False):
        self.gate = gate
        self.indexed = indexed
        self.as_float = as_float

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.baddbmm and len(args) == 3 and isinstance(args[2], GateWeight) and not kwargs:
            return args[2].gate(args[1])
        if func is F.linear and len(args) == 2 and isinstance(args[1], GateWeight) and not kwargs:
            return args[1].gate(args[0])  # float_linear: the weight as float32, as the owner casts it
        raise UserError(f"a gate weight the adapter replaced is used by {func.__name__}, which it does not know")

    def float(self) -> "GateWeight":
        """``F.linear(x, self.weight.float())`` (a hyper-connection's mixing matrix) gets the gate."""
        return GateWeight(self.gate, self.indexed, as_float=True)

    def __getitem__(self, key):
        if key != (slice(None), None) or self.indexed:
            raise UserError("a gate weight the adapter replaced is indexed in a way it does not know")
        return GateWeight(self.gate, indexed=True)

    def __matmul__(self, other: torch.Tensor) -> torch.Tensor:
        if not self.indexed:
            raise UserError("a gate weight the adapter replaced is multiplied in a way it does not know")
        return self.gate(other)


def parameter_gate(owner: nn.Module, attr: str, op: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> ParameterGate:
    """The gate module standing in for ``owner``'s parameter ``attr`` (installed once, on the instance)."""
    installed = owner.__dict__.get(attr)
    if isinstance(installed, GateWeight):
        return installed.gate
    gate = ParameterGate(owner, op)
    owner.__dict__[attr] = GateWeight(gate)
    return gate


def _parameter(owner: nn.Module, name: str) -> torch.Tensor:
    """The owner's parameter itself (``getattr`` would give the ``GateWeight`` standing in for it)."""
    parameter = owner._parameters[name]
    assert parameter is not None
    return parameter


def _rglru_gate(gate: str, owner: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """RG-LRU's ``torch.baddbmm(self.{gate}_bias[:, None, :], x, self.{gate}_weight)``."""
    return torch.baddbmm(_parameter(owner, f"{gate}_bias")[:, None, :], x, _parameter(owner, f"{gate}_weight"))


def float_linear(attr: str) -> Callable[[nn.Module, torch.Tensor], torch.Tensor]:
    """``F.linear(x, self.{attr}.float())``: a mixing matrix a module multiplies itself (DeepSeek-V4's and
    HY-V4's hyper-connections)."""
    return lambda owner, x: F.linear(x, _parameter(owner, attr).float())


def _zamba_x_proj(owner: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Zamba's ``self.x_proj_weight[:, None] @ x``."""
    return _parameter(owner, "x_proj_weight")[:, None] @ x


def _heads_first_values(output, batch_first) -> dict:
    """``[H, B·T, width]`` (RG-LRU's per-head gate pre-activations) → ``[B, T, H, width]``."""
    return _whole_values(output.transpose(0, 1), batch_first)


def _heads_first_output(values, lead):
    return _whole_output(values, lead).transpose(0, 1)


def _heads_time_last_values(output, batch_first) -> dict:
    """``[H, B, width, T]`` (Zamba's per-head x_proj) → ``[B, T, H, width]``."""
    return _whole_values(output.permute(1, 3, 0, 2), batch_first)


def _heads_time_last_output(values, lead):
    return _whole_output(values, lead).permute(2, 0, 3, 1)


def rglru_role(owner: nn.Module) -> Found:
    """RecurrentGemma's RG-LRU: the input gate and the recurrence gate, per head, each ``torch.baddbmm`` of
    the input with an ``nn.Parameter`` (before their sigmoid)."""
    if not type(owner).__name__.endswith("Rglru"):
        return []
    kind = ControllerKind(SELECTIVE_GATE, _never, _heads_first_values, _heads_first_output)
    gates = ("input_gate", "recurrent_gate")
    return [
        (f"{g}_weight", parameter_gate(owner, f"{g}_weight", functools.partial(_rglru_gate, g)), kind) for g in gates
    ]


def zamba_role(owner: nn.Module) -> Found:
    """Zamba's mamba mixer: each head's (Δ's low-rank input, B, C) is ``x_proj_weight[:, None] @ x``."""
    if not {"x_proj_weight", "dt_proj_weight"} <= set(owner._parameters):
        return []
    kind = ControllerKind(SELECTIVE_SSM, _never, _heads_time_last_values, _heads_time_last_output)
    return [("x_proj_weight", parameter_gate(owner, "x_proj_weight", _zamba_x_proj), kind)]


ROLES: list[Role] = [
    mamba_role,
    mamba2_role,
    zamba_role,
    delta_rule_role,
    attention_gate_role,
    fused_query_gate_role,
    gated_output_role,
    dynamic_conv_role,
    lstm_gate_role,
    conv_gate_role,
    rglru_role,
    altup_role,
]


def selective_controllers(model: nn.Module) -> list[tuple[str, nn.Module, ControllerKind]]:
    """``[(name, module, kind)]`` of every role's controllers in ``model``, in module order. A gate held as a
    parameter (RG-LRU, Zamba) gets a ``ParameterGate`` module, installed on its owner the first time."""
    found = []
    for name, owner in model.named_modules():
        for role in ROLES:
            for attr, module, kind in role(owner):
                found.append((f"{name}.{attr}" if name else attr, module, kind))
    return found
