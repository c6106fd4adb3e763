"""Layer stepping (``SteppingModel``) for a model whose forward runs only whole: a transformers causal LM.

The state before decoder layer l is ``[input_ids, out_0, ..., out_{l-1}]``: the window and what every layer
before l returned in the frozen pass (recorded by forward hooks). A run from layer l is the model's own
forward with decoder layers 0..l-1 replaced on the instance by functions that return their recorded outputs
(``frozen``, put back on exit), so they never run: the embedding, the position embeddings and the attention
mask are the model's own (cheap, and exactly what the layers saw), and layers l.. compute on the same
tensors as in a full frozen forward.

Where the logits are exactly the LM head's output on the last hidden state (checked on a probe:
``separate_head``), the forward's LM head returns an empty placeholder instead, ``run_blocks`` returns that
hidden state and ``head`` is the LM head, so the per-layer sweep runs head and NLL a chunk of rows at a time
(``models.head_nll``) as for the native families; elsewhere (a final soft-cap or scaling of the logits) the
head stays inside the forward: ``run_blocks`` returns the logits and ``head`` is the identity.

A looped model runs some decoder layers several times per forward (HRM's cycles, Dory's recurrent loop): the
state before a layer is kept only while every layer before it has run once and never runs again
(``once_through``, the model's ``stepping_depth``); a replay from a later layer starts from the last such
state.
"""

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import nn

from fca_workbench.adapters.protocol import Values, as_values, frozen


class WholeForward(Protocol):
    """What the stepping needs of the model: its decoder layers, the layer each controller sits in
    (``controller_layers``), its LM head where it is separate (``separate_head``) and its two runs."""

    controller_layers: list[int]
    separate_lm_head: list[nn.Module]  # [the LM head] where the logits are its output alone, else []
    stepping_depth: int  # the layers whose input states can be kept (``once_through``)

    def __call__(self, input_ids: torch.Tensor) -> Any: ...

    @property
    def blocks(self) -> list[nn.Module]: ...

    def capture_run(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, list[Values]]: ...

    def replay_run(self, input_ids: torch.Tensor, values: list[Values]) -> torch.Tensor: ...


def controller_layers(model: nn.Module, layers: list[nn.Module], controller_names: list[str]) -> list[int]:
    """Per controller, the index of the decoder layer it sits in; 0 (replay from the embeddings) for one
    outside every decoder layer, whose value can change what any layer sees."""
    paths = {id(module): name for name, module in model.named_modules()}
    prefixes = [paths[id(layer)] + "." for layer in layers if id(layer) in paths]
    if len(prefixes) != len(layers):
        return [0] * len(controller_names)
    return [next((i for i, p in enumerate(prefixes) if name.startswith(p)), 0) for name in controller_names]


def call_order(modules: list[nn.Module], run: Callable[[], Any]) -> list[int]:
    """The index in ``modules`` of each call of one of them while ``run()`` runs, in call order."""
    order: list[int] = []
    with contextlib.ExitStack() as stack:
        for index, module in enumerate(modules):
            hook = module.register_forward_pre_hook(lambda module, args, index=index: order.append(index))
            stack.callback(hook.remove)
        run()
    return order


def once_through(order: list[int], layers: int) -> int:
    """How many decoder layers, from the first, each run once, in order, before any other layer and never
    again, given the layers' ``order`` of calls in one forward: all of them in a plain stack, fewer where a
    layer runs again later (a looped model's), whose input states stepping cannot keep."""
    depth = 0
    while depth < layers and order[depth : depth + 1] == [depth] and depth not in order[depth + 1 :]:
        depth += 1
    return depth


def separate_head(model: WholeForward, probe: torch.Tensor) -> list[nn.Module]:
    """``[the LM head]`` if, on ``probe``, the forward calls it once on a ``[B, T, width]`` hidden state and
    returns exactly its output as the logits, else ``[]`` (the forward changes the logits after the head)."""
    head = getattr(getattr(model, "model", None), "get_output_embeddings", lambda: None)()
    if not isinstance(head, nn.Module):
        return []
    inputs: list[Any] = []
    with torch.no_grad(), contextlib.ExitStack() as stack:
        stack.callback(head.register_forward_pre_hook(lambda module, args: inputs.append(args)).remove)
        logits = model(probe).logits
    if len(inputs) != 1 or len(inputs[0]) != 1 or tuple(inputs[0][0].shape[:2]) != tuple(probe.shape):
        return []
    with torch.no_grad():
        own = head(inputs[0][0])
    return [head] if own.dtype == logits.dtype and own.shape == logits.shape and torch.equal(own, logits) else []


def keeping(inputs: list[torch.Tensor]) -> Any:
    """A forward that keeps its input in ``inputs`` and returns an empty placeholder of its batch shape."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        inputs.append(hidden)
        return hidden.new_empty((*hidden.shape[:-1], 0))

    return forward


def returning(output: Any) -> Any:
    """A forward that returns ``output`` whatever it is called with."""
    return lambda *args, **kwargs: output


@contextlib.contextmanager
def recording(layers: list[nn.Module], outputs: list[Any]) -> Iterator[None]:
    """Append what each of ``layers`` returns to ``outputs`` as it runs (detached)."""

    def keep(index):
        def hook(module, args, output):
            outputs.append((index, detached(output)))

        return hook

    with contextlib.ExitStack() as stack:
        for index, layer in enumerate(layers):
            stack.callback(layer.register_forward_hook(keep(index)).remove)
        yield


def detached(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.detach()
    if isinstance(output, tuple):
        return tuple(detached(item) for item in output)
    return output


class LayerStepping:
    """``embed`` / ``run_blocks`` / ``head`` / ``resume_layer`` for a ``WholeForward`` model."""

    def resume_layer(self: WholeForward, layer: int) -> int:
        """The decoder layer controller ``layer`` sits in (the layers before it see none of its values), or
        the last one whose input state is kept (``stepping_depth``), where that is before it."""
        return min(self.controller_layers[layer], self.stepping_depth)

    def embed(self, input_ids: torch.Tensor) -> list[torch.Tensor]:
        """The state before layer 0: the window alone."""
        return [input_ids]

    def head(self: WholeForward, output: torch.Tensor) -> torch.Tensor:
        """The LM head on ``run_blocks``'s last hidden state; the identity where ``run_blocks`` ran the head
        inside the forward and returned the logits."""
        return self.separate_lm_head[0](output) if self.separate_lm_head else output

    def run_blocks(
        self: WholeForward,
        state: list[Any],
        start: int,
        coefficients: list[torch.Tensor | Values] | None = None,
        keep_states: bool = False,
    ) -> tuple[torch.Tensor, list[Values], list[list[Any]] | None]:
        """``(output, values, states)`` of the forward from decoder layer ``start``; ``output``: the last hidden
        state where the LM head is separate (``head`` turns it into the logits), else the logits.

        ``coefficients``: per controller, a coefficient or its whole values (a router's output); None (from
        layer 0 only) runs the controllers live and returns the values they gave. ``values``: those of the
        controllers from layer ``start`` on. ``states`` (``keep_states``): the states before layers
        ``start .. stepping_depth`` (every layer, L, in a plain stack), each of those layers having run
        exactly once, in order (else a ValueError)."""
        layers = self.blocks
        input_ids, before = state[0], list(state[1:])
        if not 0 <= start <= self.stepping_depth or len(before) != start:
            raise ValueError(
                f"the state before layer {start} holds {start} layer outputs, got {len(before)}; states are kept "
                f"before layers 0 .. {self.stepping_depth}"
            )
        if coefficients is None and start:
            raise ValueError("a run from a later layer replays given values; only a run from layer 0 can be live")
        recorded: list[tuple[int, Any]] = []
        last: list[torch.Tensor] = []  # the LM head's input, where it is separate
        replaced = {layers[j]: returning(before[j]) for j in range(start)}
        if self.separate_lm_head:
            replaced[self.separate_lm_head[0]] = keeping(last)
        with contextlib.ExitStack() as stack:
            stack.enter_context(frozen(replaced))
            if keep_states:
                stack.enter_context(recording(layers[start:], recorded))
            if coefficients is None:
                logits, values = self.capture_run(input_ids)
            else:
                values = as_values(coefficients)
                logits = self.replay_run(input_ids, values)
        used = [value for value, layer in zip(values, self.controller_layers) if layer >= start]
        output = last[0] if self.separate_lm_head else logits
        if not keep_states:
            return output, used, None
        kept = self.stepping_depth - start
        if once_through([index for index, _ in recorded], len(layers) - start) < kept:
            raise ValueError("the decoder layers did not each run once, in order; the model cannot step by layer")
        outputs = before + [output for _, output in recorded[:kept]]
        return output, used, [[input_ids, *outputs[:j]] for j in range(start, self.stepping_depth + 1)]
