"""The live replay view's model: one checkpoint loaded once per process (``SharedModel``: model, tokenizer,
eval windows, a lock around every forward, static profiles read from a matching audit or computed lazily from
the calibration split), and one query (an ``inputs.TextInput`` with where to intervene, condition, seed, donor)
answered with per-token NLL, ΔNLL and the original and intervened coefficients, replayed by the engine
(``audit.text_replay``: an intervention at decoder layer l, or at one of its controllers, is replayed from layer l
only) and ``metrics.gap_retention``.
``DashboardSession`` is one browser session's state: its texts' replays (a bounded prefix store) and a bounded
result cache, freed by ``close``; every per-seed or per-text result is kept in a cache of fixed size.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from fca_workbench.adapters import COEFFICIENT
from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.adapters.sites import Choice, choice_name, chosen_controllers, controller_labels, site_choices
from fca_workbench.audit.assignment import Values
from fca_workbench.audit.budget import PREFIX_STORE_BYTES, PREFIX_STORE_WINDOWS
from fca_workbench.audit.inputs import CALIBRATION, EVAL
from fca_workbench.audit.metrics import bootstrap_counts, gap_retention
from fca_workbench.audit.session import ReplaySession
from fca_workbench.audit.settings import DEFAULT_WINDOW
from fca_workbench.audit.text_replay import Text, TextReplays
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import decode_tokens, load_tokenizer
from fca_workbench.data.windows import load_windows
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.fingerprints import fingerprint_tensor
from fca_workbench.results.conditions import LIVE_RUN, LOW, REFERENCE, condition_named, model_conditions
from fca_workbench.viewmodel.inputs import TextInput, window_input
from fca_workbench.viewmodel.results_folder import ResultsFolder, saved_profiles

# ------------------------------------------------------------------------------------------------------
# one checkpoint, shared read-only by every session of the process


class SharedModel:
    """A checkpoint loaded once per process. ``lock`` is held around every computation on the model.

    ``serial`` numbers the loads of the process, so state derived from one load (a session's prefix caches)
    is never mistaken for state of a later load of the same folder. ``results`` (a ``ResultsFolder``, or None)
    is where finished audits of this checkpoint may be found: their static profiles and per-layer sweeps."""

    def __init__(
        self,
        folder: str | Path,
        calibration_windows: int | None = None,
        eval_windows: int | None = None,
        results: ResultsFolder | None = None,
    ):
        self.folder = Path(folder)
        self.model = load_controlled(self.folder)  # never with remote code
        for param in self.model.parameters():
            param.requires_grad_(False)
        self.tokenizer = load_tokenizer(self.folder)
        self.arch = self.model.arch
        self.window = min(DEFAULT_WINDOW, self.model.context_length)
        self.results = results
        self.params = sum(p.numel() for p in self.model.parameters())
        self.profiles_source: str | None = None  # set with the profiles: the audit they came from, or how computed
        self.profiles_refused: str | None = None  # why a matching audit's saved profiles were not used
        self.slot_shapes = [tuple(s) for s in self.model.coefficient_slot_shapes]
        self.lock = threading.Lock()
        self.calibration_windows = calibration_windows  # None: those of this checkpoint's audit, else all
        self.stage: str | None = None  # what a long computation on the model is doing now (the status line's)
        splits: dict[str, Callable[[], tuple[Path, torch.Tensor]]] = {
            EVAL: functools.partial(self._split, EVAL, eval_windows),
            CALIBRATION: lambda: self._split(CALIBRATION, self._calibration_count()),
        }
        device = next(self.model.parameters()).device
        # the session keeps no cache on disk: profiles are estimated batch by batch under the lock, in batches the
        # session fits to the device
        self.session = ReplaySession(
            self.model, splits, cache_root=None, device=device, tokenizer=self.tokenizer, lock=self.lock
        )
        self.session.on_profile_batch = self._estimating
        self.eval_windows = self.session.windows(EVAL)
        self.top_k = self.session.router_top_k  # per controller, a router's k, which adds the routing conditions
        # a model without a controller shows every condition as the live run, with a note that says so
        self.conditions = self.session.conditions if self.has_coefficients else model_conditions(routed=False)
        names, layers = self.model.controller_names, self.model.controller_layers
        # where an intervention can go: a decoder layer's controllers together, or one alone in a layer of several
        self.site_choices = site_choices(names, layers)
        self.controller_labels = controller_labels(names, layers)  # each controller's name on a figure's axis
        self.serial = self.session.serial
        self._profiles_lock = threading.Lock()

    def _split(self, split: str, count: int | None) -> tuple[Path, torch.Tensor]:
        path = split_path(split)
        return path, load_windows(path, self.tokenizer, self.window, count)

    def _calibration_count(self) -> int | None:
        """The calibration windows of the profiles: the server's ``--calibration-windows``, else those of this
        checkpoint's newest audit in the results folder (whose saved profiles then serve), else all."""
        if self.calibration_windows is None and self.results is not None and self.has_coefficients:
            self.stage = "looking for this checkpoint's audits (hashing its weights)"
            audits = self.results.audits_of(self)
            if audits:
                return audits[0].valid_audit["data"]["calibration"]["windows"]
        return self.calibration_windows

    def _estimating(self, done: int, total: int) -> None:
        self.stage = f"computing static profiles: {done} of {total} calibration windows"

    @property
    def has_coefficients(self) -> bool:
        return bool(self.slot_shapes)

    def check_condition(self, condition: str) -> None:
        """One line for a condition this view does not show for the model (a router's for a model without)."""
        if condition not in self.conditions:
            raise UserError(f"unknown intervention '{condition}'; choose one of {', '.join(self.conditions)}")

    @torch.no_grad()
    def profiles(self) -> dict[str, list[torch.Tensor]]:
        """Static profiles of the calibration split, once: an audit's saved ones when one in the results folder
        has this model's and these calibration windows' fingerprints and its file the sha256 it recorded
        (``saved_profiles``), else the session's, estimated batch by batch under the lock. ``profiles_source``
        says which."""
        with self._profiles_lock:
            if self.profiles_source is None:
                try:
                    return self._first_profiles()
                finally:
                    self.stage = None
            return self.session.profiles

    def _first_profiles(self) -> dict[str, list[torch.Tensor]]:
        """``profiles`` the first time, each stage said in ``stage``."""
        windows = self.session.windows(CALIBRATION)
        if self.results is not None and self.has_coefficients:
            needed = {c for c in self.conditions if condition_named(c).static}
            saved, said = saved_profiles(self.results, self, fingerprint_tensor(windows), needed)
            if saved is not None:
                self.session.use_profiles(saved)
                self.profiles_source = said
                return saved
            self.profiles_refused = said
        self._estimating(0, len(windows))
        profiles = self.session.profiles  # estimated here (``session.on_profile_batch`` says how far)
        unmatched = (
            self.profiles_refused or "no audit in the results folder matches this checkpoint and calibration data"
        )
        self.profiles_source = f"computed here from {len(windows)} calibration windows" + (
            f" ({unmatched})" if self.results is not None else ""
        )
        return profiles

    @property
    def fingerprint(self) -> str:
        """``capture.model_fingerprint`` of the model, hashed once (it reads every weight)."""
        return self.session.fingerprint

    def donor_for(self, window_index: int | None, seed: int) -> int:
        """The audit's donor: the seeded derangement's choice for this window (pasted text: window 0's)."""
        return self.session.donor_of(window_index or 0, seed)

    def controllers_at(self, at: Choice) -> list[int] | None:
        """The controller indices ``at`` (a decoder layer, a controller's module path; None: every one) names;
        one line for a choice the model lacks."""
        try:
            return chosen_controllers(at, self.model.controller_names, self.model.controller_layers)
        except ValueError as error:
            raise UserError(str(error)) from None

    def slot_labels(self, index: int) -> list[str]:
        """Names of controller ``index``'s flattened slots, as the model declares them (``audit.json``'s
        ``model.slot_labels``), shared across controllers where the slot means the same."""
        return self.model.slot_labels(index)

    def all_slot_labels(self) -> list[str]:
        """Every controller's slot names, each once, in order of first appearance."""
        return distinct_labels(self.slot_labels(index) for index in range(len(self.slot_shapes)))


def distinct_labels(per_layer: Iterable[list[str]]) -> list[str]:
    """Every layer's slot labels, each once, in the order the layers first name them (the heatmap's slot choices)."""
    return list(dict.fromkeys(label for labels in per_layer for label in labels))


# ------------------------------------------------------------------------------------------------------
# one query's answer


def token_counts(tokens: int) -> torch.Tensor:
    """The bootstrap a live view's retention is judged with: resamples of one text's tokens (tokens of one text
    are not independent, so this interval is narrower than a bootstrap over windows; a gap it does not resolve
    certainly does not)."""
    return bootstrap_counts(tokens, resamples=200) if tokens >= 2 else torch.ones(1, 1, dtype=torch.long)


@dataclass
class Analysis:
    """Everything one view of the dashboard shows, as plain numbers."""

    checkpoint: str
    arch: str
    condition: str
    layer: int | str | None  # where the intervention went: a decoder layer, a controller's module path, or everywhere
    seed: int
    donor: int | None
    tokens: list[str]
    nll_correct: np.ndarray  # [T-1]: position t predicts token t+1
    nll_condition: np.ndarray
    coefficients_correct: list[np.ndarray]  # per controller [T, S_c], slots flattened
    coefficients_condition: list[np.ndarray]
    slot_labels: list[list[str]]  # per controller
    start_layer: int  # the decoder layer the replay started from (0 = from the embeddings)
    controller_labels: list[str] = field(default_factory=list)  # per controller: ``layer L``, or its module path
    retention: float | None = None
    nll_global_mean: float | None = None
    profiles_source: str | None = None  # static profiles: the audit they came from, or how they were computed
    compute_ms: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        """Where the intervention went: ``all layers``, ``layer L`` (a decoder layer), or a controller's path."""
        return choice_name(self.layer)

    @property
    def delta(self) -> np.ndarray:
        return self.nll_condition - self.nll_correct

    @property
    def summary(self) -> dict:
        return {
            "tokens scored": len(self.nll_correct),
            "mean NLL correct": float(self.nll_correct.mean()),
            f"mean NLL {self.condition}": float(self.nll_condition.mean()),
            "mean ΔNLL": float(self.delta.mean()),
            "max |ΔNLL|": float(np.abs(self.delta).max()),
            "retention": self.retention,
        }

    def all_slot_labels(self) -> list[str]:
        """Every slot label of any controller, once, in the order the controllers name them."""
        return distinct_labels(self.slot_labels)

    def layer_position(self, slot: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Original, intervened and difference ``[controllers, T]`` of one slot (NaN where a controller lacks it)."""
        length = len(self.tokens)
        rows = []
        for coefficients in (self.coefficients_correct, self.coefficients_condition):
            grid = np.full((len(coefficients), length), np.nan)
            for layer, (values, labels) in enumerate(zip(coefficients, self.slot_labels)):
                if slot in labels:
                    grid[layer] = values[:, labels.index(slot)]
            rows.append(grid)
        return rows[0], rows[1], rows[1] - rows[0]

    def slot_position(self, index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Original, intervened and difference ``[slots, T]`` of controller ``index``."""
        original = self.coefficients_correct[index].T.astype(np.float64)
        intervened = self.coefficients_condition[index].T.astype(np.float64)
        return original, intervened, intervened - original


def engine_text(text: TextInput) -> Text:
    """A query's tokens as the engine replays them."""
    return Text(text.ids, text.window_index)


def _flat(coefficients: list[torch.Tensor]) -> list[np.ndarray]:
    return [c[0].reshape(c.shape[1], -1).float().numpy() for c in coefficients]


class DashboardSession:
    """One browser session: its texts' frozen replays (``text_replay.TextReplays``, a bounded prefix store) and a
    bounded cache of their NLLs, freed by ``close``."""

    def __init__(
        self, max_windows: int = PREFIX_STORE_WINDOWS, max_bytes: int = PREFIX_STORE_BYTES, max_results: int = 32
    ):
        self.replays = TextReplays(max_windows, max_bytes)
        self.results: OrderedDict = OrderedDict()
        self.max_results = max_results
        self._mutex = threading.Lock()

    def close(self) -> None:
        self.replays.clear()
        with self._mutex:
            self.results.clear()

    def forget(self, shared: SharedModel) -> None:
        """Drop the prefix caches of ``shared`` (being unloaded), which hold its model."""
        self.replays.forget(shared.session)

    def condition_values(
        self, shared: SharedModel, text: TextInput, condition: str, seed: int, donor: int | None, layer: Choice
    ) -> Values:
        """Per controller, the values ``condition`` assigns to this text at ``layer`` only (a decoder layer, a
        controller's module path) or everywhere, as the
        audit assigns them (``TextReplays.values``); the static profiles first, an audit's saved ones when one
        matches."""
        shared.check_condition(condition)
        if condition_named(condition).static:
            shared.profiles()
        given = None if donor is None else engine_text(window_input(shared, donor))
        at = shared.controllers_at(layer)
        return self.replays.values(shared.session, engine_text(text), condition, seed, given, at)

    def replay(
        self,
        name: str,
        shared: SharedModel,
        text: TextInput,
        condition: str,
        layer: Choice,
        seed: int,
        donor: int | None,
    ) -> np.ndarray:
        """Per-token NLL ``[T-1]`` of ``condition`` at ``layer`` (a decoder layer, a controller's module path; None:
        all layers), cached per session; a NaN or
        inf is a UserError naming the condition and the window (``TextReplays.nll``)."""
        key = (name, str(shared.folder), text.key, condition, layer, seed, donor)
        with self._mutex:
            if key in self.results:
                self.results.move_to_end(key)
                return self.results[key]
        if condition_named(condition).static and shared.has_coefficients:
            shared.profiles()
        given = None if donor is None else engine_text(window_input(shared, donor))
        at = shared.controllers_at(layer) if shared.has_coefficients else None
        nll = self.replays.nll(shared.session, engine_text(text), condition, at, seed, given).numpy()
        with self._mutex:
            self.results[key] = nll
            while len(self.results) > self.max_results:
                self.results.popitem(last=False)
        return nll

    def analyse(
        self,
        name: str,
        shared: SharedModel,
        text: TextInput,
        condition: str,
        layer: Choice = None,
        seed: int = 0,
        donor: int | None = None,
    ) -> Analysis:
        """Answer one query. ``donor`` (cross_input only): an eval window index, None for the audit's own
        seeded derangement. Raises ``UserError`` for anything the user can fix."""
        started = time.perf_counter()
        shared.check_condition(condition)
        named = condition_named(condition)
        at = shared.controllers_at(layer) if shared.has_coefficients else None
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise UserError(f"seed must be a non-negative integer, got {seed!r}")
        notes = [text.note] if text.note else []
        if named.needs_donor:
            if donor is None:
                donor = shared.donor_for(text.window_index, seed)
            else:
                window_input(shared, donor)  # validates the index
                if donor == text.window_index:
                    notes.append(f"the donor is the window itself: {condition} equals {REFERENCE}")
        else:
            donor = None
        if not named.seeded:
            seed = 0
        if not shared.has_coefficients:
            notes.append(f"{shared.arch} has no controller: there are no coefficients to intervene on")
        prefix = self.replays.prefix(shared.session, engine_text(text))
        nll_correct = self.replay(name, shared, text, LIVE_RUN, None, 0, None).astype(np.float64)
        nll = self.replay(name, shared, text, condition, layer, seed, donor).astype(np.float64)
        if shared.has_coefficients and not named.baseline:
            intervened = self.condition_values(shared, text, condition, seed, donor, layer)
        else:
            intervened = prefix.values
        retention = nll_gm = None
        if named.static and shared.has_coefficients:
            gm = self.replay(name, shared, text, LOW, layer, 0, None).astype(np.float64)
            nll_gm = float(gm.mean())
            per_token = {
                LOW: torch.tensor(gm, dtype=torch.float64),
                condition: torch.tensor(nll, dtype=torch.float64),
                REFERENCE: torch.tensor(nll_correct, dtype=torch.float64),
            }
            figure = gap_retention(per_token, condition, token_counts(len(nll)))
            retention = figure["value"]
            if retention is None:
                gap = figure["denominator"]
                notes.append(
                    f"no retention: the {LOW}-to-correct gap on this text ({gap['value']:+.4f} nats, 95% CI over "
                    f"tokens [{gap['ci95'][0]:+.4f}, {gap['ci95'][1]:+.4f}]) does not resolve"
                )
            if shared.profiles_refused is not None:
                notes.append(f"static profiles {shared.profiles_source}")
        start = prefix.start_for(at) if at is not None else 0
        return Analysis(
            checkpoint=name,
            arch=shared.arch,
            condition=condition,
            layer=layer,
            seed=seed,
            donor=donor,
            tokens=decode_tokens(shared.tokenizer, text.ids[0].tolist()),
            nll_correct=nll_correct,
            nll_condition=nll,
            coefficients_correct=_flat(prefix.coefficients),
            coefficients_condition=_flat([value[COEFFICIENT] for value in intervened]),
            slot_labels=[shared.slot_labels(i) for i in range(len(shared.slot_shapes))],
            start_layer=start,
            controller_labels=shared.controller_labels,
            retention=retention,
            nll_global_mean=nll_gm,
            profiles_source=shared.profiles_source if nll_gm is not None else None,
            compute_ms=(time.perf_counter() - started) * 1000,
            notes=notes,
        )
