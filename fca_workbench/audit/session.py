"""The replay session: the audit's method in one place, for every surface that runs it.

One session holds one controlled model, its eval and calibration windows, their coefficient caches, the
calibration profiles and the seed. It knows the model's conditions and answers the coefficients and the NLL of
any condition for any windows and layer, with the finiteness guard and the replay check inside. ``run_audit``,
the per-layer sweep, the training mini-audit, the explorer, the dashboard's live view, ``fca eval`` and ``fca
export`` all ask a session; none of them captures, estimates profiles or replays by itself.

Everything is computed when first asked for and then kept: a surface that needs only the calibration profiles
(``fca eval``) never captures the eval windows, and one that explores a window never captures the calibration
set until a static condition is asked for. A session without a cache folder (the dashboard's) estimates its
profiles batch by batch in memory, holding no cache at all.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from fca_workbench.adapters.protocol import COEFFICIENT, ControlledModel
from fca_workbench.audit.assignment import (
    ConditionCoefficients,
    Profiles,
    Values,
    calibration_profiles,
    placed,
    profiles_of,
    static_values,
)
from fca_workbench.audit.budget import audit_batch_size
from fca_workbench.audit.capture import CoefficientCache, capture, model_fingerprint
from fca_workbench.audit.distributed import SINGLE, Ranks
from fca_workbench.audit.fingerprint_memo import loaded_identity, remembered_fingerprint
from fca_workbench.audit.forward import forward_nll
from fca_workbench.audit.guard import check_correct_replay
from fca_workbench.audit.inputs import CALIBRATION, EVAL, audit_windows, data_summary, load_audit_model
from fca_workbench.audit.interventions import derangement, routing_top_k
from fca_workbench.audit.lexical import vocabulary, with_kept_own
from fca_workbench.audit.metrics import VarianceAccumulator, condition_figures, retention_figures
from fca_workbench.audit.replay import replay_nll
from fca_workbench.audit.settings import AuditSettings
from fca_workbench.audit.sweep import WindowNLL, per_layer_window_nll
from fca_workbench.foundation.checkpoint import Checkpoint, resolve_checkpoint
from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import LIVE_RUN, REFERENCE, condition_named, model_conditions, retention_profiles
from fca_workbench.results.layout import cache_root

Split = tuple[Path | None, torch.Tensor]  # a split's text file (None: windows handed in) and its windows
DERANGEMENTS_KEPT = 64  # the cross_input derangements of the most recently used seeds (the dashboard's seed box)
VARIANCE_KEYS = ("r2_layer", "r2_layer_slot", "r2_layer_slot_position", "r2_layer_slot_window")
VARIATION_KEYS = ("within_std", "cv", "within_std_per_layer")
SERIALS = itertools.count()  # a process's sessions numbered, so state kept of one is never taken for a later one's
LOADING_SETTINGS = ("dtype", "controllers", "only_controllers", "trust_remote_code")  # what the weights loaded hang on


class ReplaySession:
    """One model's audit method: captures, profiles, conditions and replay, each computed once when needed.

    ``splits``: per split (``eval``, ``calibration``), how to read its text file and windows, called once when
    first needed. ``cache_root``: where the coefficient caches of the splits live (``<root>/<split>``); None
    keeps nothing on disk (profiles estimated batch by batch; no eval cache). ``batch_size`` None: fitted to
    the device and the eval cache (``budget.audit_batch_size``), the smallest any rank can fit. ``ranks``: under
    torchrun each rank captures and replays its share of the shards. ``lock``: held around every forward of the
    model (a dashboard shares one model between sessions)."""

    def __init__(
        self,
        model: ControlledModel,
        splits: Mapping[str, Callable[[], Split]],
        *,
        cache_root: Path | None,
        seed: int = 0,
        device: torch.device | str = "cpu",
        batch_size: int | None = None,
        ranks: Ranks = SINGLE,
        tokenizer: PreTrainedTokenizerBase | None = None,
        checkpoint: Checkpoint | None = None,
        settings: AuditSettings | None = None,
        lock: threading.Lock | None = None,
    ) -> None:
        self.model, self._tokenizer, self.checkpoint, self.settings = model, tokenizer, checkpoint, settings
        self.cache_root, self.seed, self.device, self.ranks = cache_root, seed, device, ranks
        self.lock = lock or threading.Lock()
        self.serial = next(SERIALS)
        self._known_fingerprint: str | None = None  # ``open``'s, for a model loaded straight from its folder
        self._splits = splits
        self._read: dict[str, Split] = {}
        self._given_batch_size = batch_size
        self._profiles_lock = threading.Lock()
        self._assigners: dict[tuple[str, tuple[int, ...] | None], ConditionCoefficients] = {}
        self._caches: dict[str, CoefficientCache] = {}
        self.derangement = functools.lru_cache(maxsize=DERANGEMENTS_KEPT)(self._derangement)
        # told (windows done, windows in all) after each batch of profiles estimated in memory (the dashboard's
        # status line); None: nobody is told
        self.on_profile_batch: Callable[[int, int], None] | None = None

    @classmethod
    def open(
        cls,
        settings: AuditSettings,
        out: Path | None = None,
        ranks: Ranks = SINGLE,
        checkpoint: Checkpoint | None = None,
        read_now: Sequence[str] = (EVAL, CALIBRATION),
        memo_root: Path | None = None,
    ) -> ReplaySession:
        """The session of ``settings``: the checkpoint resolved once, the model loaded and placed with its
        tokenizer, the splits of ``read_now`` read at once (so a bad text file is refused before any work), the
        others when first needed; caches under ``settings.cache``, else ``<out>/cache``. Then the model's
        fingerprint, from the memo in ``memo_root`` (default: the cache root) when it knows this checkpoint's
        content (``fingerprint_memo.py``), else hashed and remembered there, while the model is still as loaded;
        a folder the memo does not cover, or no cache root, leaves it to be hashed when first asked."""
        checkpoint = checkpoint or resolve_checkpoint(settings.checkpoint, settings.trust_remote_code)
        (model, tokenizer), identity = loaded_identity(
            checkpoint.folder,
            {key: getattr(settings, key) for key in LOADING_SETTINGS},
            lambda: load_audit_model(settings, out, ranks, checkpoint),
        )
        session = cls.of_model(model, tokenizer, settings, out, ranks, read_now)
        session.checkpoint = checkpoint
        memo_root = memo_root or session.cache_root
        if memo_root is not None and identity is not None:
            session._known_fingerprint = remembered_fingerprint(
                memo_root, identity, lambda: model_fingerprint(model), ranks.lead
            )
        return session

    @classmethod
    def of_model(
        cls,
        model: ControlledModel,
        tokenizer: PreTrainedTokenizerBase,
        settings: AuditSettings,
        out: Path | None = None,
        ranks: Ranks = SINGLE,
        read_now: Sequence[str] = (EVAL, CALIBRATION),
    ) -> ReplaySession:
        """The session of a controlled model already loaded (``open``'s, or one a user holds in memory:
        ``controlled_model``) with its tokenizer, read and cached as ``open`` does; its fingerprint is hashed
        when first asked for, so a cache still binds to these very weights."""
        splits = {
            split: functools.partial(audit_windows, settings, split, model, tokenizer) for split in (EVAL, CALIBRATION)
        }
        session = cls(
            model,
            splits,
            cache_root=cache_root(settings.cache, out) if settings.cache or out else None,
            seed=settings.seed,
            device=settings.device,
            batch_size=settings.batch_size,
            ranks=ranks,
            tokenizer=tokenizer,
            settings=settings,
        )
        for split in read_now:
            session.windows(split)
        return session

    # -- inputs -----------------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        if self._tokenizer is None:
            raise ValueError("a session opened on windows handed in has no tokenizer")
        return self._tokenizer

    def split(self, split: str) -> Split:
        """The text file and windows of ``split``, read once."""
        if split not in self._read:
            self._read[split] = self._splits[split]()
        return self._read[split]

    def windows(self, split: str = EVAL) -> torch.Tensor:
        return self.split(split)[1]

    def data_summary(self, split: str) -> dict:
        """What ``audit.json`` records of ``split``: its file, windows and fingerprint."""
        path, windows = self.split(split)
        if path is None:
            raise ValueError(f"the {split} windows were handed in: no file to record")
        return data_summary(path, windows)

    @property
    def has_controller(self) -> bool:
        return bool(self.model.controllers)

    @functools.cached_property
    def batch_size(self) -> int:
        """Windows per batch: the settings', else fitted (``budget.audit_batch_size``; under torchrun the
        smallest any rank can fit, so every rank cuts the same shards)."""
        if self._given_batch_size is not None:
            return self._given_batch_size
        split = EVAL if EVAL in self._read or CALIBRATION not in self._read else CALIBRATION
        folder = None if self.cache_root is None else self.cache_root / EVAL
        fitted = audit_batch_size(self.model, self.windows(split).shape[1], self.device, folder)
        return self.ranks.smallest(fitted)

    @property
    def fitted_settings(self) -> AuditSettings:
        """The settings with the batch size filled in (what ``audit.json`` records)."""
        if self.settings is None:
            raise ValueError("a session opened on windows handed in has no settings")
        return replace(self.settings, batch_size=self.batch_size)

    @functools.cached_property
    def fingerprint(self) -> str:
        """``capture.model_fingerprint``, hashed once for every capture and binding of the session (or taken
        when ``open`` loaded it)."""
        if self._known_fingerprint is not None:
            return self._known_fingerprint
        with self.lock:
            return model_fingerprint(self.model)

    # -- captures and profiles --------------------------------------------------------------------------

    def cache(self, split: str) -> CoefficientCache:
        """The coefficient cache of ``split``: captured (each rank its share), resumed, or reused."""
        if self.cache_root is None:
            raise ValueError("this session keeps no cache on disk")
        if split not in self._caches:
            self._caches[split] = capture(
                self.model,
                self.windows(split),
                self.cache_root / split,
                batch_size=self.batch_size,
                device=self.device,
                desc=f"capture {split}",
                ranks=self.ranks,
                fingerprint=self.fingerprint,
            )
        return self._caches[split]

    def capture_all(self) -> None:
        """The captures in the audit's order: the eval windows, then (with a controller) the calibration windows
        and their profiles."""
        self.cache(EVAL)
        if self.has_controller:
            self.profiles  # noqa: B018 (estimated now, not at the first static condition)

    @property
    def eval_cache(self) -> CoefficientCache:
        return self.cache(EVAL)

    @property
    def profiles(self) -> Profiles:
        """The calibration set's static profiles (plus ``layer_mean_topk`` for routers), once: from the
        calibration cache (summed over ranks), or batch by batch in memory without a cache folder."""
        with self._profiles_lock:
            if "_profiles" not in self.__dict__:
                if self.cache_root is not None:
                    cache = self.cache(CALIBRATION)
                    windows, shards = self.windows(CALIBRATION), self.ranks.share(cache.num_shards())
                    self._profiles = calibration_profiles(cache, windows, shards, self.ranks.sum)
                else:
                    windows = self.windows(CALIBRATION)
                    self._profiles = profiles_of(self._live_batches(windows), self.router_top_k, vocabulary(windows))
            return self._profiles

    def use_profiles(self, profiles: Profiles) -> None:
        """Profiles read from elsewhere (an audit's saved ones, checked by the caller) instead of estimated."""
        with self._profiles_lock:
            self._profiles = profiles

    def profiles_for(self, conditions: Iterable[str]) -> Profiles | None:
        """The calibration profiles when some of ``conditions`` is static (estimated then), else None."""
        return self.profiles if any(condition_named(c).static for c in conditions) else None

    def _live_batches(self, windows: torch.Tensor) -> Iterable[tuple[torch.Tensor, list[torch.Tensor]]]:
        for start in range(0, len(windows), self.batch_size):
            with self.lock, torch.no_grad():
                _, values = forward_nll(self.model, windows[start : start + self.batch_size].to(self.device))
            yield windows[start : start + self.batch_size], [value[COEFFICIENT] for value in values]
            if self.on_profile_batch is not None:
                self.on_profile_batch(min(start + self.batch_size, len(windows)), len(windows))

    @functools.cached_property
    def router_top_k(self) -> list[int | None]:
        """Per controller, a router's k (None: not a top-k router), read from a capture the session made or
        from a two-token live run."""
        if EVAL in self._caches:
            return routing_top_k(self._caches[EVAL].values(torch.arange(1)))
        split = next((s for s in (EVAL, CALIBRATION) if s in self._read), EVAL)  # windows already read, if any
        with self.lock, torch.no_grad():
            return routing_top_k(forward_nll(self.model, self.windows(split)[:1, :2].to(self.device))[1])

    @functools.cached_property
    def conditions(self) -> tuple[str, ...]:
        """Every condition this model's audit replays: the live run alone without a controller; section 4's, plus
        the routing ones when some controller is a top-k router."""
        if not self.has_controller:
            return (LIVE_RUN,)
        return model_conditions(any(k is not None for k in self.router_top_k))

    def check_condition(self, name: str, what: str = "condition") -> str:
        """``name`` when this model replays it, else one line naming what it does replay."""
        if name not in self.conditions:
            known = condition_named(name) if name in model_conditions(True) else None
            why = "is only for models whose controllers are top-k routers" if known else "is not one of its conditions"
            raise UserError(f"{what} '{name}' {why}; {self.model.arch} replays {', '.join(self.conditions)}")
        return name

    # -- what a condition assigns -----------------------------------------------------------------------

    def _derangement(self, seed: int) -> torch.Tensor:
        return derangement(len(self.windows(EVAL)), seed)

    def donor_of(self, window: int, seed: int | None = None) -> int:
        """The audit's donor of eval window ``window`` under ``seed`` (default: the session's)."""
        return int(self.derangement(self.seed if seed is None else seed)[window])

    def _assigner(self, condition: str, controllers: Sequence[int] | None) -> ConditionCoefficients:
        key = (condition, None if controllers is None else tuple(controllers))
        if key not in self._assigners:
            profiles = self.profiles_for([condition])
            self._assigners[key] = ConditionCoefficients(
                condition, self.eval_cache, profiles, self.seed, key[1], self.windows(EVAL)
            )
        return self._assigners[key]

    def values(self, condition: str, indices: torch.Tensor, controllers: Sequence[int] | None = None) -> Values:
        """Per controller, the cached values ``condition`` assigns to eval windows ``indices`` at ``controllers``
        only (None: everywhere), on the CPU in the dtype captured."""
        if condition_named(condition).live:
            return self.eval_cache.values(indices)
        return self._assigner(condition, controllers).values(indices)

    def coefficients(
        self, condition: str, indices: torch.Tensor, controllers: Sequence[int] | None = None
    ) -> list[torch.Tensor]:
        """Per controller ``[B, T, *slot]``: the coefficients ``condition`` assigns to eval windows ``indices``."""
        return [value[COEFFICIENT] for value in self.values(condition, indices, controllers)]

    # -- replay ---------------------------------------------------------------------------------------

    def window_nll(
        self, condition: str, indices: torch.Tensor, controllers: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Per-token NLL ``[len(indices), T-1]`` of eval windows ``indices`` replayed as one batch under
        ``condition`` (the live run: its cached NLL)."""
        return self.nll(condition, controllers, batches=[indices])

    def nll(
        self,
        condition: str,
        controllers: Sequence[int] | None = None,
        shards: Iterable[int] | None = None,
        batches: Sequence[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Per-token NLL ``[N, T-1]`` of every eval window (with ``shards``, one rank's share: those shards'
        windows; with ``batches``, those windows) under ``condition``, at ``controllers`` alone (one decoder
        layer's or one controller's indices) or everywhere (``replay.replay_nll``: batches follow the cache's
        shards, so ``correct`` repeats capture's arithmetic exactly; a NaN or inf stops it)."""
        profiles = self.profiles_for([condition])
        return replay_nll(
            self.model,
            self.windows(EVAL),
            self.eval_cache,
            condition,
            profiles,
            self.seed,
            controllers,
            self.device,
            shards,
            batches,
        )

    def replay(self, conditions: Iterable[str], shards: Iterable[int] | None = None) -> dict[str, torch.Tensor]:
        """Per condition, the per-token NLL of every eval window (or ``shards``' windows), in the order
        ``conditions`` (any iterable: a progress bar) gives them."""
        shards = None if shards is None else list(shards)
        return {condition: self.nll(condition, shards=shards) for condition in conditions}

    def sweep(
        self, conditions: Sequence[str], shards: Iterable[int] | None = None
    ) -> tuple[WindowNLL, torch.Tensor | None]:
        """The per-layer sweep (``sweep.per_layer_window_nll``) of the interventions among ``conditions``:
        per-window mean NLL per (site, condition) and that of ``correct``; ({}, None) with none."""
        swept = [c for c in conditions if condition_named(c).intervention]
        if not swept:
            return {}, None
        profiles = self.profiles_for(swept)
        return per_layer_window_nll(
            self.model, self.windows(EVAL), self.eval_cache, swept, profiles, self.seed, self.device, shards=shards
        )

    @torch.no_grad()
    def logits(self, condition: str, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, T, V]`` of any token ids under a condition that needs no cached values of them: a
        baseline runs the live model, a static profile is broadcast to every position (``fca eval``'s texts)."""
        self.model.eval()
        if condition_named(condition).baseline:
            return self.model(input_ids).logits
        batch, length = input_ids.shape
        shapes = self.model.coefficient_slot_shapes
        values = static_values(condition, self.profiles_for([condition]), shapes, batch, length, input_ids)
        return self.model.replay_run(input_ids, placed(self.model, values, input_ids.device))

    # -- figures --------------------------------------------------------------------------------------

    def figures(self, per_token: dict[str, torch.Tensor], counts: torch.Tensor) -> dict:
        """``replay_check``, ``conditions`` and ``retention`` of ``audit.json`` from the per-token NLLs of every
        replayed condition (every window, in order): the frozen ``correct`` checked against the live run within
        the model's ``replay_tolerance`` (or the audit stops), NLL and ΔNLL against the reference with bootstrap
        CIs, the retention of every replayed profile, ``kept_own`` beside ``same_token`` (``lexical.with_kept_own``)."""
        figures = replay_figures(per_token, counts, self.has_controller, self.model.replay_tolerance)
        return with_kept_own(figures, self.windows(EVAL), self.seed)

    def spread(self) -> dict:
        """``variance`` and ``variation`` of ``audit.json``: the decomposition and variation of the cached eval
        coefficients, one shard at a time (each rank its share, sums added up over the ranks)."""
        cache = self.eval_cache
        accumulator = VarianceAccumulator(origin=[c[0, 0] for c in cache.coefficients([0])])
        for indices in cache.shard_indices(self.ranks.share(cache.num_shards())):
            accumulator.update(cache.coefficients(indices), int(indices[0]))
        accumulator.combine(self.ranks.sum, cache.num_windows)
        return spread_figures(accumulator.result() if self.ranks.lead else None)


def replay_figures(
    per_token: dict[str, torch.Tensor], counts: torch.Tensor, has_controller: bool, replay_tolerance: float
) -> dict:
    """``ReplaySession.figures`` of per-token NLLs gathered from every rank."""
    check = None
    reference = REFERENCE if has_controller else LIVE_RUN
    if has_controller:
        windows = range(len(per_token[REFERENCE]))
        check = check_correct_replay(per_token[REFERENCE], per_token[LIVE_RUN], replay_tolerance, windows)
    window_nll = {name: nll.double().mean(dim=1) for name, nll in per_token.items()}
    profiles = retention_profiles(window_nll) if has_controller else ()
    return {
        "replay_check": check,
        "conditions": condition_figures(window_nll, counts, reference=reference),
        "retention": retention_figures(window_nll, profiles, counts),
    }


def spread_figures(spread: dict | None) -> dict:
    """``variance`` and ``variation`` of ``audit.json`` from a variance accumulator's result (None: no
    coefficients)."""
    return {
        "variance": None if spread is None else {k: spread[k] for k in VARIANCE_KEYS},
        "variation": None if spread is None else {k: spread[k] for k in VARIATION_KEYS},
    }
