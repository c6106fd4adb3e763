"""The prefix cache: replay an intervention at layer l without recomputing the layers before it.

One unperturbed pass over a window keeps the state before every layer (``model.embed`` /
``model.run_blocks`` / ``model.head``, the protocol's layer stepping, ``SteppingModel``) together with the
window's own controller values and NLL. A replay whose values differ from the window's own at some controllers
only (one decoder layer's, or one controller) starts from the kept state before the earliest
``model.resume_layer(c)`` among them (l for controller l of Dense and FeatureGate, l + 1 for MUDDPythia, whose
coefficient of layer l only mixes outputs that already exist; the decoder layer holding the controller for a
transformers model) and gives exactly the logits of a full frozen forward: the same ops on the same tensors.

A model without layer stepping (a ``ControlledModel`` that is not a ``SteppingModel``) keeps no states; its
one-layer and all-layer replays are the protocol's full frozen forward, ``model.replay_run(input_ids,
values)``, with the window's own cached values at every other controller.

``PrefixStore`` keeps a few windows' caches under a byte budget (least recently used out first), so the
memory one user of the dashboard can hold is bounded; ``clear`` frees it all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

import torch

from fca_workbench.adapters.protocol import (
    COEFFICIENT,
    ControlledModel,
    SteppingModel,
    Values,
    as_coefficients,
    as_values,
)
from fca_workbench.audit.budget import PREFIX_STORE_BYTES, PREFIX_STORE_WINDOWS
from fca_workbench.audit.forward import forward_nll
from fca_workbench.models import head_nll, next_token_nll

# before a layer: a tensor, or a list (MUDDPythia's streams; a transformers model's window and layer outputs)
State = TypeVar("State", torch.Tensor, list[Any])


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)
    elif isinstance(obj, dict):
        yield from _tensors(list(obj.values()))


def tensor_bytes(*objs: object) -> int:
    """Bytes held by the distinct tensor storages in ``objs`` (MUDDPythia's states share their tensors)."""
    seen, total = set(), 0
    for obj in objs:
        for tensor in _tensors(obj):
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
    return total


class PrefixCache:
    """One window's unperturbed run: its controllers' values (``correct``), per-token NLL and, for a model
    that steps layer by layer, the states before every layer.

    ``input_ids`` is ``[B, T]`` (the dashboard uses B = 1). ``lock`` (optional) is held around every
    computation on the shared model, so sessions that share one model never run it concurrently.
    """

    @torch.no_grad()
    def __init__(
        self,
        model: ControlledModel,
        input_ids: torch.Tensor,
        lock: AbstractContextManager[Any] | None = None,
        coefficients: Iterable[Values | torch.Tensor] | None = None,
    ):
        """``coefficients`` (layer-stepping models only): None keeps the live run (controllers running); the
        cached ``correct`` values (or coefficients) keep the frozen run instead, so every later replay repeats
        exactly the arithmetic of a frozen forward (the per-layer sweep's reference)."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        self.model, self.input_ids, self.lock = model, input_ids, lock or nullcontext()
        # the model's layer stepping, None for a model without it (asked once, here)
        self.stepper: SteppingModel | None = model if isinstance(model, SteppingModel) else None
        self.stepping = self.stepper is not None
        given = None if coefficients is None else as_values(coefficients)
        if given is not None and self.stepper is None:
            raise ValueError("a frozen prefix run needs a model with layer stepping")
        model.check_inputs(input_ids, None if given is None else [value[COEFFICIENT] for value in given])
        with self.lock:
            if self.stepper is not None:
                stepper = self.stepper
                frozen_run = None if given is None else as_coefficients(given)
                output, used, states = stepper.run_blocks(stepper.embed(input_ids), 0, frozen_run, keep_states=True)
                nll = head_nll(model, output, input_ids)  # as ``forward.forward_nll`` computes it
                values = [{name: t.detach() for name, t in value.items()} for value in as_values(used)]
            else:
                (nll, values), states = forward_nll(model, input_ids), None
        self.states = states  # states[l]: the state before layer l, l = 0 .. n_layer (None: no stepping)
        self.values = values  # per controller, the window's own (= ``correct``) values, e.g. a router's whole output
        self.nll = nll  # [B, T-1], the live run (= ``correct``, bit-exact)
        self.num_controllers = len(values)

    @property
    def coefficients(self) -> list[torch.Tensor]:
        return [value[COEFFICIENT] for value in self.values]

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.states, self.values, self.nll, self.input_ids)

    def start_for(self, controllers: Collection[int] | None) -> int:
        """The decoder layer from which a replay of values that differ from the window's own at ``controllers``
        only (indices; None: at any) must start: the earliest any of them can alter; 0 (the embeddings) for a
        model without layer stepping."""
        if controllers is None:
            return 0
        outside = sorted(c for c in controllers if not 0 <= c < self.num_controllers)
        if not controllers or outside:
            raise ValueError(
                f"controllers {outside or '[]'} are out of range: the model has {self.num_controllers} controllers"
            )
        stepper = self.stepper
        return 0 if stepper is None else min(stepper.resume_layer(c) for c in controllers)

    @torch.no_grad()
    def logits(
        self, values: Iterable[Values | torch.Tensor], controllers: Collection[int] | None = None, copies: int = 1
    ) -> torch.Tensor:
        """Logits of the frozen replay with ``values`` (per controller: a values dict or a coefficient
        tensor, for every layer; controllers off).

        ``controllers``: the only controllers (indices) at which ``values`` may differ from ``self.values`` (as
        made by ``interventions.restrict_to``); with layer stepping, the decoder layers before the earliest of
        them are not recomputed. None: all controllers. ``copies`` (layer stepping): how many variants of the batch ``values`` holds,
        concatenated along the batch dimension (``[copies * B, T, *slot]``); they resume from the one kept
        state as one batch.
        """
        return self._replay(values, controllers, copies)

    @torch.no_grad()
    def replay_nll(
        self, values: Iterable[Values | torch.Tensor], controllers: Collection[int] | None = None, copies: int = 1
    ) -> torch.Tensor:
        """Per-token NLL ``[copies * B, T-1]`` of the frozen replay (see ``logits``). With layer stepping the
        head and the NLL run a chunk of rows at a time (``head_nll``), within float rounding of
        ``next_token_nll(self.logits(...))`` and faster, since the whole logits are never held."""
        input_ids = repeat_batch(self.input_ids, copies)
        if not self.stepping:
            return next_token_nll(self._replay(values, controllers, copies), input_ids)
        return self._replay(values, controllers, copies, lambda output: head_nll(self.model, output, input_ids))

    def _replay(self, values, controllers, copies, finish=None):
        """The frozen replay's logits, or with layer stepping ``finish`` of its last state (default: the
        head's logits), under ``lock``."""
        values = as_values(values)
        start = self.start_for(controllers)
        if self.stepper is None:
            if copies != 1:
                raise ValueError("batched variants need a model with layer stepping")
            self.model.check_inputs(self.input_ids, [value[COEFFICIENT] for value in values])
            with self.lock:
                return self.model.replay_run(self.input_ids, values)
        self.model.check_inputs(repeat_batch(self.input_ids, copies), [value[COEFFICIENT] for value in values])
        assert self.states is not None  # kept by every stepping run
        with self.lock:
            state = repeat_batch(self.states[start], copies)
            output, _, _ = self.stepper.run_blocks(state, start, as_coefficients(values))
            return self.stepper.head(output) if finish is None else finish(output)

    def replay_nll_many(
        self, variants: Sequence[Sequence[Values | torch.Tensor]], controllers: Collection[int]
    ) -> torch.Tensor:
        """Per-token NLL ``[K, B, T-1]`` of K per-controller lists (values or coefficients) that differ from the
        window's own at ``controllers`` only, run from the state before them as one batch of K x B windows; variants
        whose values hold different entries (a router's whole output, a static profile's coefficient) run as
        one batch each."""
        given = [as_values(variant) for variant in variants]
        entries = [tuple(tuple(value) for value in variant) for variant in given]
        nll: list[torch.Tensor] = [self.nll] * len(given)
        for names in dict.fromkeys(entries):
            members = [i for i, held in enumerate(entries) if held == names]
            values = [
                {name: torch.cat([given[i][index][name] for i in members]) for name in held}
                for index, held in enumerate(names)
            ]
            rows = self.replay_nll(values, controllers, copies=len(members)).view(len(members), *self.nll.shape)
            for i, row in zip(members, rows):
                nll[i] = row
        return torch.stack(nll)


def repeat_batch(state: State, copies: int) -> State:
    """A state (a tensor, or a list of them: MUDDPythia's streams; a transformers model's window and layer
    outputs, a tuple or None among them) repeated ``copies`` times along the batch dim."""
    if copies == 1 or state is None:
        return state
    if isinstance(state, torch.Tensor):
        return state.repeat(copies, *([1] * (state.dim() - 1)))
    return type(state)(repeat_batch(item, copies) for item in state)


class PrefixStore:
    """A bounded, thread-safe LRU of ``PrefixCache``s keyed by the caller (e.g. (checkpoint, window)).

    At most ``max_entries`` caches and ``max_bytes`` bytes are kept; the most recent one always stays, even
    when it alone is over the budget.
    """

    def __init__(self, max_entries: int = PREFIX_STORE_WINDOWS, max_bytes: int = PREFIX_STORE_BYTES):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict = OrderedDict()
        self._mutex = threading.Lock()

    def get(self, key: tuple, build: Callable[[], PrefixCache]) -> PrefixCache:
        """The cache under ``key``, built with ``build()`` (outside the store's own lock) when missing."""
        with self._mutex:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        cache = build()
        with self._mutex:
            self._entries[key] = cache
            self._entries.move_to_end(key)
            self._evict()
        return cache

    def _evict(self) -> None:
        while len(self._entries) > 1 and (len(self._entries) > self.max_entries or self._nbytes() > self.max_bytes):
            self._entries.popitem(last=False)

    def _nbytes(self) -> int:
        return sum(cache.nbytes for cache in self._entries.values())

    @property
    def nbytes(self) -> int:
        with self._mutex:
            return self._nbytes()

    def __len__(self) -> int:
        return len(self._entries)

    def discard(self, predicate: Callable[[tuple], bool]) -> None:
        """Drop the caches whose key satisfies ``predicate``."""
        with self._mutex:
            for key in [key for key in self._entries if predicate(key)]:
                del self._entries[key]

    def clear(self) -> None:
        with self._mutex:
            self._entries.clear()
