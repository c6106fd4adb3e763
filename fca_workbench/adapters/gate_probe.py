"""Gates found by what they do: one probe forward that follows every projection's output through the
model and sees where, after a sigmoid, a softmax or an exp, it scales, masks or mixes another branch of the
hidden state. A gate is such a projection; class and attribute names only label what is found.

The probe tags the output of every ``F.linear`` (an ``nn.Linear``, or a parameter a module multiplies
itself, like a hyper-connection's mixing matrix) with the module that owns the weight, and carries the tag
through shape and elementwise operations. A tagged value that meets another hidden-state tensor in a matrix
product before any gate activation is a bilinear form (attention scores), not a gate: the tag is dropped.
A content nonlinearity (SiLU, GELU, ReLU, tanh) drops it too: ``act(gate_proj(x)) * up_proj(x)`` inside a
gated MLP is the layer's nonlinearity, not coefficients emitted for another computation, so dense
Llama-style models have no gate. Values computed from an already-claimed controller's output (Mamba's
Δ = softplus(dt_proj(·)) of ``x_proj``'s output) are frozen with it and never reported. A view of a
parameter (a learned query) in a matrix product with the hidden state, whatever projection that state
still carries, is the query's scores: through a softmax into a product with the states, its weights mix them.
A tensor made only in the shape of a tagged one (``zeros_like``, ``new_zeros``: an accumulator) carries no tag;
it takes the tag of what is written into it (``out[:, t] = value``). A gate that also divides the sum it
weighs (RWKV's ``exp(key)`` over time steps, numerator and denominator of the WKV recurrence) *normalizes*:
its weights are a weighted average's, reported as ``mixing_weight``.

What the probe finds falls in two groups: a whole projection output that only gates (every column, no
slice on the way) is replayed by ``whole_kind`` at the projection, and a learned query's weights over a
stack of states per token by ``fca_workbench.adapters.depth_mixing``, exactly (in a looped layer, once per
call: ``fca_workbench.adapters.hf.per_call``); anything else (a slice of a fused projection no role knows,
a parameter product no role wraps, a gate outside the decoder layers, a projection whose output on some
call is not one row per token) is *left out* and said so in the report and ``audit.json``.
"""

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fca_workbench.adapters.classification import INDEXER
from fca_workbench.adapters.depth_mixing import MIXING, mixing_gate
from fca_workbench.adapters.families import (
    ATTENTION_OUTPUT_GATE,
    CROSS_LAYER_MIXING,
    DYNAMIC_MASK,
    HYPER_CONNECTION,
    INPUT_GATE,
    LSTM_GATE,
    MIXING_WEIGHT,
    NORM_GATE,
    RECEPTANCE_GATE,
)
from fca_workbench.adapters.selective import Found, float_linear, parameter_gate, whole_kind

GATE_ACTIVATIONS = {torch.sigmoid, torch.Tensor.sigmoid, F.sigmoid, torch.exp, torch.Tensor.exp, torch.softmax}
GATE_ACTIVATIONS |= {torch.Tensor.softmax, F.softmax, torch.special.expit}
CONTENT_NONLINEARITIES = {F.silu, F.gelu, F.relu, torch.tanh, torch.Tensor.tanh, F.tanh, F.mish, torch.relu}
CONTENT_NONLINEARITIES |= {torch.Tensor.relu}  # a softplus carries the tag: exp(A·softplus(·)) is a gate
MATRIX_PRODUCTS = {torch.matmul, torch.Tensor.matmul, torch.bmm, torch.einsum, torch.Tensor.__matmul__, F.linear}
COMBINES = {torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.add, torch.Tensor.add}
COMBINES |= {torch.Tensor.__add__, torch.Tensor.__radd__, torch.sub, torch.Tensor.__sub__, torch.Tensor.__truediv__}
COMBINES |= {torch.where, torch.Tensor.masked_fill, torch.addcmul, torch.Tensor.__iadd__, torch.Tensor.__imul__}
COMBINES |= {torch.Tensor.mul_, torch.Tensor.add_, torch.baddbmm, torch.Tensor.div, torch.div}
ATTENTION_KERNELS = {F.scaled_dot_product_attention}  # a mask given to one of these shifts the scores
CASTS = {torch.Tensor.float, torch.Tensor.to, torch.Tensor.type}
WEIGHT_VIEWS = {torch.Tensor.view, torch.Tensor.expand, torch.Tensor.reshape, torch.Tensor.unsqueeze}
WEIGHT_VIEWS |= {torch.Tensor.__getitem__}  # one of several learned queries (Inkling2-loop's per loop layer)
SLICES = {torch.split, torch.Tensor.split, torch.chunk, torch.Tensor.chunk, torch.Tensor.__getitem__}
SLICES |= {torch.unbind, torch.Tensor.unbind, torch.narrow, torch.Tensor.narrow, torch.Tensor.split_with_sizes}
SHAPE_ONLY = {torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like, torch.rand_like, torch.randn_like}
SHAPE_ONLY |= {torch.randint_like, torch.Tensor.new_zeros, torch.Tensor.new_ones, torch.Tensor.new_empty}
SHAPE_ONLY |= {torch.Tensor.new_full}  # a fresh tensor shaped like its argument: derived from nothing
DIVISIONS = {torch.Tensor.__truediv__, torch.Tensor.div, torch.div}  # `a / b` calls Tensor.div


@dataclass(frozen=True)
class Tag:
    """A value derived from the output of ``owner`` (a module path; ``weight``: the parameter's name), with
    ``sliced`` when only some of its columns got here, ``activated`` after a gate activation, ``claimed``
    when the owner is a controller already found (or the value follows from one by fixed parameters)."""

    owner: str
    weight: str
    sliced: bool = False
    activated: bool = False
    claimed: bool = False
    query: bool = False  # a learned query's scores against hidden states (no F.linear: not a projection)


@dataclass
class Gate:
    """A gate the probe saw: ``owner``'s output (``weight`` names its parameter) ``how`` another branch."""

    owner: str
    weight: str
    sliced: bool
    how: str  # "scales" (a product) or "masks" (a sum with scores: a dynamic mask)
    only_gates: bool = True  # every use of the output is a gate's (no content column): replayable whole
    per_token: bool = True  # every call's output has one row per token ([B, T, ...] or [B·T, ...])
    learned_query: bool = False  # a parameter attending over hidden states inside an attention kernel
    normalizes: bool = False  # also divides what it scales: weights of a weighted average (RWKV's WKV key)


@dataclass
class Findings:
    gates: dict[tuple[str, str], Gate] = field(default_factory=dict)
    content: set[tuple[str, str]] = field(default_factory=set)  # outputs also used as content
    leads: dict[tuple[str, str], set[tuple[int, ...]]] = field(default_factory=dict)  # projections' output shapes


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors(item)]
    return []


class _Probe(TorchFunctionMode):
    """Carries tags and a *hidden* mark (derived from the token embeddings) through one forward."""

    def __init__(self, owners: dict[int, tuple[str, str]], claimed: set[str]):
        super().__init__()
        self.owners = owners  # id(parameter) → (module path, parameter name)
        self.claimed = claimed
        self.tags: dict[int, tuple[weakref.ref, Tag | None]] = {}  # id → (the tensor, its tag; None: hidden)
        self.findings = Findings()
        self.keep: list[torch.Tensor] = []  # the casts of weights, alive while their ids name them
        self.views: dict[int, tuple[str, str]] = {}  # id(a view of a weight) → its owner

    def mark(self, tensor: torch.Tensor, tag: Tag | None) -> None:
        self.tags[id(tensor)] = (weakref.ref(tensor), tag)

    def lookup(self, tensor: torch.Tensor) -> tuple[bool, Tag | None]:
        """``(hidden, tag)``: whether the tensor derives from the hidden state, and its tag."""
        entry = self.tags.get(id(tensor))
        if entry is None or entry[0]() is not tensor:
            return False, None
        return True, entry[1]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        weight = (self.owners.get(id(args[0])) or self.views.get(id(args[0]))) if args else None
        if func in CASTS and args and id(args[0]) in self.owners and isinstance(output, torch.Tensor):
            self.owners[id(output)] = self.owners[id(args[0])]  # w.float(): the same weight
            self.keep.append(output)
        elif (func in WEIGHT_VIEWS or func in CASTS) and weight is not None and isinstance(output, torch.Tensor):
            self.views[id(output)] = weight  # a view of a weight (or its cast): not F.linear's operand
            self.keep.append(output)
        if func in ATTENTION_KERNELS and len(args) > 1 and id(args[0]) in self.views and self.lookup(args[1])[0]:
            owner = self.views[id(args[0])]  # a learned query attending over hidden states (mixing weights)
            self.findings.gates[owner] = Gate(*owner, sliced=False, how="mixes", learned_query=True)
            if isinstance(output, torch.Tensor):
                self.findings.leads.setdefault(owner, set()).add(tuple(output.shape[:2]))
        if func in SHAPE_ONLY:  # zeros_like(key): only its shape; what is written into it tags it (below)
            return output
        inputs = [self.lookup(t) for t in _tensors(args) + _tensors(kwargs)]
        if not any(hidden for hidden, _ in inputs):
            return output
        tags = [tag for _, tag in inputs if tag is not None]
        untagged = sum(1 for hidden, tag in inputs if hidden and tag is None)
        result = self.follow(func, args, tags, untagged)
        if result is not None and isinstance(output, torch.Tensor):
            if func is F.linear:
                self.findings.leads.setdefault((result.owner, result.weight), set()).add(tuple(output.shape[:-1]))
            elif result.query and not any(tag.query for tag in tags):  # a learned query's scores [B, T, q, stack]
                self.findings.leads.setdefault((result.owner, result.weight), set()).add(tuple(output.shape[:2]))
        for tensor in _tensors(output):
            self.mark(tensor, result)
        if func is torch.Tensor.__setitem__ and args and isinstance(args[0], torch.Tensor):
            self.mark(args[0], result)  # out[:, t] = value: out now holds what was written into it
        return output

    def follow(self, func: Callable, args: tuple, tags: list[Tag], untagged: int) -> Tag | None:
        """The tag of ``func``'s output from its inputs' (None: plain hidden state)."""
        fixed = bool(tags) and all(tag.claimed for tag in tags) and not untagged  # frozen with a controller
        if func is F.linear:
            weight = args[1] if len(args) > 1 else None
            owner = self.owners.get(id(weight)) if isinstance(weight, torch.Tensor) else None
            if owner is None:
                return None
            return Tag(*owner, claimed=fixed or owner[0] in self.claimed)
        if func in MATRIX_PRODUCTS and any(id(a) in self.views for a in args[:2]) and not fixed:
            # a learned query scoring hidden states (attention over layers); a projection they carry is content
            self.findings.content.update((t.owner, t.weight) for t in tags if not t.activated and not t.claimed)
            owner = next(self.views[id(a)] for a in args[:2] if id(a) in self.views)
            if ".".join(owner) in self.claimed:  # a gate weight a role wraps (Zamba's x_proj_weight[:, None] @ x)
                return Tag(*owner, claimed=True)
            return Tag(*owner, query=True)
        if not tags:
            return None
        tag = tags[0]
        if func in GATE_ACTIVATIONS:
            return Tag(tag.owner, tag.weight, tag.sliced, True, tag.claimed, tag.query) if len(tags) == 1 else None
        if func in CONTENT_NONLINEARITIES:
            if not tag.claimed:
                self.findings.content.add((tag.owner, tag.weight))
            return tag if tag.claimed else None
        if func in MATRIX_PRODUCTS or func in COMBINES or func in ATTENTION_KERNELS:
            divisor = self.lookup(args[1])[1] if func in DIVISIONS and len(args) > 1 else None
            return self.combine(func, tags, untagged, divisor)
        if func in SLICES:
            return Tag(tag.owner, tag.weight, True, tag.activated, tag.claimed)
        return tag if len({(t.owner, t.weight) for t in tags}) == 1 else None

    def combine(self, func: Callable, tags: list[Tag], untagged: int, divisor: Tag | None = None) -> Tag | None:
        """A product or sum of tagged values with others: an activated tag meeting another branch is a
        gate (``divisor``: the tag of what a division divides by); a plain projection scaled elementwise
        stays itself; anything else is content."""
        others = untagged + len({(t.owner, t.weight) for t in tags}) - 1
        if all(tag.claimed for tag in tags):
            return tags[0] if not untagged else None
        for tag in tags:
            if tag.activated and not tag.claimed and others:
                masks = func in ATTENTION_KERNELS or func in {torch.add, torch.Tensor.add, torch.Tensor.__add__}
                key = (tag.owner, tag.weight)
                seen = self.findings.gates.get(key)
                sliced = tag.sliced or bool(seen and seen.sliced)
                how = "masks" if masks else "scales"
                normalizes = tag == divisor or bool(seen and seen.normalizes)
                gate = Gate(tag.owner, tag.weight, sliced, how, learned_query=tag.query, normalizes=normalizes)
                self.findings.gates[key] = gate
        if others == 0 and func not in MATRIX_PRODUCTS and func not in ATTENTION_KERNELS:
            # one projection's gate with its own plain output (x·σ(x), a recurrence a·h + x) is that output
            return next((tag for tag in tags if not tag.activated), tags[0])
        if untagged and len(tags) == 1 and func in COMBINES and not tags[0].activated:
            return tags[0]  # a projection scaled by a norm of its input (a hyper-connection's mixes)
        self.findings.content.update((t.owner, t.weight) for t in tags if not t.activated and not t.claimed)
        return None


def probe_gates(model: nn.Module, input_ids: torch.Tensor, claimed: list[str]) -> list[Gate]:
    """The gates one forward of ``model`` on ``input_ids`` shows (``claimed``: the controllers found
    already; their outputs, and what follows from them by fixed parameters, are not gates again)."""
    owners = {id(p): (name.rpartition(".")[0], name.rpartition(".")[2]) for name, p in model.named_parameters()}
    probe = _Probe(owners, set(claimed))
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    if not isinstance(embeddings, nn.Module):  # where the hidden state starts is unknown: nothing to follow
        return []
    handles = [embeddings.register_forward_hook(lambda module, args, output: probe.mark(output, None))]
    claimed_modules = {model.get_submodule(name): name for name in claimed if _has(model, name)}
    for module, name in claimed_modules.items():

        def hook(module, args, output, name=name):
            for tensor in _tensors(output):
                probe.mark(tensor, Tag(name, "", claimed=True))

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad(), probe:
            model(input_ids=input_ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    inside = tuple(name + "." for name in claimed)
    gates = [
        gate
        for gate in probe.findings.gates.values()
        if gate.owner not in claimed_modules.values() and not gate.owner.startswith(inside)
    ]
    for gate in gates:
        gate.only_gates = (gate.owner, gate.weight) not in probe.findings.content
        tokens = {tuple(input_ids.shape), (input_ids.numel(),)}
        gate.per_token = probe.findings.leads.get((gate.owner, gate.weight), set()) <= tokens
    return gates


def _has(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def gate_kind_name(model: nn.Module, gate: Gate) -> str:
    """The kind a probed gate is reported as: where it sits (its owner's class names it, as a hint only)."""
    path = gate.owner.split(".")
    ancestors = [type(model.get_submodule(".".join(path[:i]))).__name__ for i in range(len(path) - 2, len(path) + 1)]
    names = f"{' '.join(ancestors)} {path[-1]}"  # the owner's, its parent's and grandparent's classes
    if gate.learned_query:
        return CROSS_LAYER_MIXING
    if gate.normalizes:
        return MIXING_WEIGHT
    if gate.how == "masks":
        return DYNAMIC_MASK
    if "Hyper" in names or "Residual" in names or "hc" in gate.owner.rpartition(".")[2]:
        return HYPER_CONNECTION
    if "LSTM" in names:
        return LSTM_GATE
    if "Rwkv" in names or "receptance" in names:
        return RECEPTANCE_GATE
    if "Norm" in names:
        return NORM_GATE
    if "Attention" in names:
        return ATTENTION_OUTPUT_GATE
    return INPUT_GATE


def probed_controllers(
    model: nn.Module, input_ids: torch.Tensor, claimed: list[str], add: bool = True
) -> tuple[Found, list[str]]:
    """``(controllers, left out)``: the probe's gates no kind or role claimed, each replayed where it can be
    exactly (a whole ``nn.Linear`` output that only gates: ``whole_kind``; a parameter the owner multiplies by
    ``F.linear(x, w.float())``: a ``ParameterGate``; a learned query's weights, one row per token: its
    ``mixing_gate``), else one line saying what is left out and why. With ``add`` false
    (``--only-controllers``) every gate found is left out."""
    found: Found = []
    left_out = []
    for gate in probe_gates(model, input_ids, claimed):
        owner = model.get_submodule(gate.owner)
        kind = gate_kind_name(model, gate)
        described = f"{gate.owner} ({type(owner).__name__}): a {kind}"
        if not add:
            left_out.append(f"{described} not among --only-controllers; it runs live")
        elif not gate.per_token:
            left_out.append(f"{described} whose output on some call is not one row per token; it runs live")
        elif gate.learned_query:
            module = mixing_gate(owner)
            if module is None:
                left_out.append(f"{described} whose attention kernel its config does not name; it runs live")
            else:
                found.append((f"{gate.owner}.{gate.weight}", module, MIXING))
        elif isinstance(owner, nn.Linear) and gate.only_gates:
            found.append((gate.owner, owner, whole_kind(kind)))
        elif not isinstance(owner, nn.Linear) and gate.weight in owner._parameters:
            module = parameter_gate(owner, gate.weight, float_linear(gate.weight))
            found.append((f"{gate.owner}.{gate.weight}", module, whole_kind(kind)))
        else:
            left_out.append(f"{described} whose output is also used as content; it runs live")
    return found, left_out


def learned_indexers(model: nn.Module, claimed: list[str]) -> list[str]:
    """One left-out line per sparse-attention indexer with weights of its own (DeepSeek-V3.2's DSA and its kin):
    input-dependent like a gate, yet its indices cannot be replayed as coefficients, so the audit says so. An
    indexer without weights (a top-k of its layer's own query-key scores) is the attention's own sparsity."""
    return [
        f"{name} ({type(module).__name__}): {INDEXER}"
        for name, module in model.named_modules()
        if type(module).__name__.endswith("Indexer")
        and any(True for _ in module.parameters())
        and not any(name == c or name.startswith(f"{c}.") for c in claimed)
    ]
