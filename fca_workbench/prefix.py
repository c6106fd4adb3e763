"""The prefix cache: replay an intervention at layer l without recomputing the layers before it.

One unperturbed pass over a window keeps the state before every layer (``model.embed`` /
``model.run_blocks`` / ``model.head``, the explicit layer-stepping API of every family) together with the
window's own coefficients and NLL. A replay whose coefficients differ from the window's own at layer l only
starts from the kept state before ``model.resume_layer(l)`` (l for Dense and FeatureGate, l + 1 for
MUDDPythia, whose coefficient of layer l only mixes outputs that already exist) and gives exactly the logits
of a full ``model(input_ids, coefficients=...)`` forward: the same ops on the same tensors.

``PrefixStore`` keeps a few windows' caches under a byte budget (least recently used out first), so the
memory one user of the dashboard can hold is bounded; ``clear`` frees it all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import nullcontext

import torch

from .models import next_token_nll


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors(item)


def tensor_bytes(*objs) -> int:
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
    """One window's unperturbed run: states before every layer, its coefficients and per-token NLL.

    ``input_ids`` is ``[B, T]`` (the dashboard uses B = 1). ``lock`` (optional) is held around every
    computation on the shared model, so sessions that share one model never run it concurrently.
    """

    @torch.no_grad()
    def __init__(self, model, input_ids: torch.Tensor, lock=None):
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {tuple(input_ids.shape)}")
        model.check_inputs(input_ids, None)
        self.model, self.input_ids, self.lock = model, input_ids, lock or nullcontext()
        with self.lock:
            output, used, states = model.run_blocks(model.embed(input_ids), 0, None, keep_states=True)
            logits = model.head(output)
        self.states = states  # states[l]: the state before layer l, l = 0 .. n_layer
        self.coefficients = [c.detach() for c in used]  # the window's own (= ``correct``) coefficients
        self.nll = next_token_nll(logits, input_ids)  # [B, T-1], the live run (= ``correct``, bit-exact)

    @property
    def num_layers(self) -> int:
        return len(self.states) - 1

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.states, self.coefficients, self.nll, self.input_ids)

    def start_for(self, layer: int | None) -> int:
        """Where a replay of coefficients that differ from the window's own at ``layer`` only (None: at any
        layer) must start."""
        if layer is None:
            return 0
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer {layer} is out of range: the model has {self.num_layers} layers")
        return self.model.resume_layer(layer)

    @torch.no_grad()
    def logits(self, coefficients: list[torch.Tensor], layer: int | None = None) -> torch.Tensor:
        """Logits of the frozen replay with ``coefficients`` (the full per-layer list, controller off).

        ``layer``: the one layer at which ``coefficients`` may differ from ``self.coefficients`` (as made by
        ``interventions.restrict_to_layer``); the layers before it are not recomputed. None: all layers.
        """
        self.model.check_inputs(self.input_ids, coefficients)
        start = self.start_for(layer)
        with self.lock:
            output, _, _ = self.model.run_blocks(self.states[start], start, coefficients)
            return self.model.head(output)

    def replay_nll(self, coefficients: list[torch.Tensor], layer: int | None = None) -> torch.Tensor:
        """Per-token NLL ``[B, T-1]`` of the frozen replay (see ``logits``)."""
        return next_token_nll(self.logits(coefficients, layer), self.input_ids)


class PrefixStore:
    """A bounded, thread-safe LRU of ``PrefixCache``s keyed by the caller (e.g. (checkpoint, window)).

    At most ``max_entries`` caches and ``max_bytes`` bytes are kept; the most recent one always stays, even
    when it alone is over the budget.
    """

    def __init__(self, max_entries: int = 4, max_bytes: int = 256 * 2**20):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict = OrderedDict()
        self._mutex = threading.Lock()

    def get(self, key, build) -> PrefixCache:
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
        while len(self._entries) > 1 and (
            len(self._entries) > self.max_entries or self._nbytes() > self.max_bytes
        ):
            self._entries.popitem(last=False)

    def _nbytes(self) -> int:
        return sum(cache.nbytes for cache in self._entries.values())

    @property
    def nbytes(self) -> int:
        with self._mutex:
            return self._nbytes()

    def __len__(self) -> int:
        return len(self._entries)

    def discard(self, predicate) -> None:
        """Drop the caches whose key satisfies ``predicate``."""
        with self._mutex:
            for key in [key for key in self._entries if predicate(key)]:
                del self._entries[key]

    def clear(self) -> None:
        with self._mutex:
            self._entries.clear()
