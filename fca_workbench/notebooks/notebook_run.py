"""The notebooks' ``NotebookRun`` and the audits it shares across notebooks and runs.

Every audit-reading notebook builds one ``NotebookRun`` from its parameters cell; ``fca reproduce`` builds the
same ones before any notebook starts. An audit lies in ``<audits>/<checkpoint>/`` and is reused by every
notebook of the run and by any rerun into the same folder: a ``provenance.json`` beside its ``audit.json``
records the settings and the size and mtime of every input file, and only an exact match is reused.
Coefficient caches live in one shared folder (default ``results/cache/``), keyed by checkpoint, data and
settings, so they are reused across runs too; ``capture`` still checks their fingerprints. Default folders are
relative to where the notebook runs, so a notebook copied into a user's folder writes there, not into the
workbench's checkout.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from fca_workbench.audit.capture import read_manifest
from fca_workbench.audit.run import run_audit
from fca_workbench.audit.settings import PAPER_RUN, AuditSettings, paper_default
from fca_workbench.data.corpus import split_path
from fca_workbench.explore import Explorer
from fca_workbench.foundation.checkpoint import (
    checkpoint_key,
    checkpoint_name,
    hub_name,
    recorded_name,
    resolve_checkpoint,
)
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.files import read_json, write_json
from fca_workbench.foundation.progress import progress as progress_bar
from fca_workbench.foundation.resources import checkpoints_dir
from fca_workbench.results.figures import audit_caption, show, write_figure
from fca_workbench.results.layout import AUDIT_FILE, AUDITS_DIR, CACHE_DIR, NOTEBOOKS_DIR, PROVENANCE_FILE, split_cache
from fca_workbench.results.tabular import styled, write_table

if TYPE_CHECKING:  # the notebooks' libraries, imported by the notebooks themselves
    import pandas as pd
    import plotly.graph_objects as go
    from pandas.io.formats.style import Styler

SHIPPED = [f"featuregate-s{s}" for s in range(7)] + ["dense-s0", "muddpythia-s0", "moe-s0", "ssm-s0"]
DEFAULT_MAX_WINDOWS = PAPER_RUN["max_windows"]  # the paper run's windows of each set, as the notebooks show it
PATH_PARAMETERS = ("eval_data", "calibration_data")
AUDIT_NAMES = {"eval_data": "eval", "calibration_data": "calibration"}  # a parameter's name → the audit setting's
RESULTS = Path("results")  # under the folder a notebook or fca reproduce runs in
DEFAULT_CACHE = RESULTS / CACHE_DIR


def shipped_checkpoints(names: list[str] = SHIPPED) -> list[str]:
    """The shipped checkpoints' folders (``names`` of them), as the notebooks' default ``checkpoints``."""
    return [str(checkpoints_dir() / name) for name in names]


def _stat(path: Path) -> list[int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _input_files(settings: AuditSettings) -> dict[str, list[int] | None]:
    """Size and mtime of every file the audit reads: the checkpoint folder's files and both data sets."""
    named = settings.checkpoint  # a hub name: the snapshot its revision points at now
    folder = resolve_checkpoint(named).folder if hub_name(named) else Path(named)
    files = sorted(p for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
    files += [
        Path(settings.eval) if settings.eval else split_path("eval"),
        Path(settings.calibration) if settings.calibration else split_path("calibration"),
    ]
    return {str(p.resolve()): _stat(p) for p in files}


def input_bytes(settings: AuditSettings) -> int:
    """Bytes of every file the audit reads (``_input_files``): how large its checkpoint is, to order audits."""
    return sum(stat[0] for stat in _input_files(settings).values() if stat)


def provenance(settings: AuditSettings) -> dict:
    """What an audit was computed from: its settings and the size and mtime of every input file."""
    return {"settings": asdict(settings), "inputs": _input_files(settings)}


def shared_cache(cache_root: str | Path, settings: AuditSettings) -> Path:
    """The coefficient cache folder of one checkpoint under the shared root, keyed by everything that
    changes its content (a stale key is still caught by the cache's own fingerprints)."""
    key = {
        "checkpoint": settings.checkpoint,
        "weights": {name: value for name, value in _input_files(settings).items()},
        "window": settings.window,
        "max_windows": settings.max_windows,
        "window_sampling": "even",  # caches of the first-N sampling have other windows: never the same key
        "batch_size": settings.batch_size,
        "dtype": settings.dtype,
        "device": settings.device.split(":")[0],
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_root).resolve() / f"{checkpoint_name(settings.checkpoint)}-{digest}"


def read_finished(path: str | Path) -> dict | None:
    """A JSON file's content, or None when it is missing or unreadable (an audit to run again, which reports
    what is wrong with its folder)."""
    try:
        return cast(dict, read_json(Path(path)))
    except UserError:
        return None


def audit_is_current(settings: AuditSettings, folder: str | Path) -> bool:
    """True when ``folder`` holds a finished audit of exactly these settings and inputs (``provenance``)."""
    folder = Path(folder)
    if read_finished(folder / PROVENANCE_FILE) != provenance(settings) or read_finished(folder / AUDIT_FILE) is None:
        return False
    try:
        # None for a cache of an older format: captured again
        manifest = read_manifest(split_cache(settings.cache, folder, "eval"))
    except UserError:
        return False  # a broken manifest: the audit runs again and reports it
    return bool(manifest and manifest["complete"])


def ensure_audit(settings: AuditSettings, folder: str | Path) -> dict:
    """The audit of ``settings`` in ``folder``: read back when its provenance matches, else run."""
    folder = Path(folder)
    if audit_is_current(settings, folder):
        return cast(dict, read_finished(folder / AUDIT_FILE))  # audit_is_current has read it
    before = provenance(settings)
    (folder / PROVENANCE_FILE).unlink(missing_ok=True)  # an audit interrupted from here on is never current
    audit = cast(dict, run_audit(settings, folder))  # one process: the audit always comes back
    write_json(folder / PROVENANCE_FILE, before)
    return audit


@dataclass
class NotebookRun:
    """What a notebook's parameters cell says, turned into audits: the one object every notebook builds.

    ``checkpoints=None`` means the shipped checkpoints; ``out=None`` means ``results/notebooks``;
    ``audits=None`` means ``<out>/audits``; ``cache=None`` means the shared ``results/cache`` (both ``results/``
    in the folder the notebook runs in).
    """

    checkpoints: Any = None  # folders or hub names (or one); a list[str] of checkpoint_key after __post_init__
    eval_data: str | None = paper_default("eval")
    calibration_data: str | None = paper_default("calibration")
    window: int | None = paper_default("window")
    max_windows: int | None = paper_default("max_windows")
    device: str = paper_default("device")
    dtype: str = paper_default("dtype")
    seed: int = paper_default("seed")
    batch_size: int | None = paper_default("batch_size")
    per_layer: bool = paper_default("per_layer")
    out: Any = None  # str or None as given; a resolved Path after __post_init__, as audits and cache
    audits: Any = None
    cache: Any = None
    progress: bool = True
    _audits: list[dict] | None = field(default=None, repr=False)
    _explorers: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.checkpoints, (str, os.PathLike)):
            self.checkpoints = [self.checkpoints]
        self.checkpoints = [checkpoint_key(c) for c in (self.checkpoints or shipped_checkpoints())]
        names = [checkpoint_name(c) for c in self.checkpoints]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise UserError(f"two checkpoints share the folder name {duplicates[0]}; audits are filed by that name")
        self.out = Path(self.out or RESULTS / NOTEBOOKS_DIR).resolve()
        self.audits = Path(self.audits).resolve() if self.audits else self.out / AUDITS_DIR
        self.cache = Path(self.cache or DEFAULT_CACHE).resolve()

    def settings(self, checkpoint: str | Path) -> AuditSettings:
        """The audit settings of ``checkpoint`` in this run: every audit setting the parameters cell names
        (``AUDIT_NAMES`` maps the two spelled otherwise), data files resolved, its coefficient cache under the
        shared root."""
        audit_fields = {f.name for f in dataclasses.fields(AuditSettings)} - {"checkpoint", "cache"}
        given = {AUDIT_NAMES.get(f.name, f.name): getattr(self, f.name) for f in dataclasses.fields(self)}
        chosen = {name: value for name, value in given.items() if name in audit_fields}
        for name in PATH_PARAMETERS:
            chosen[AUDIT_NAMES[name]] = str(Path(getattr(self, name)).resolve()) if getattr(self, name) else None
        settings = AuditSettings(checkpoint=checkpoint_key(checkpoint), **chosen)
        return dataclasses.replace(settings, cache=str(shared_cache(self.cache, settings)))

    def audit_dir(self, audit_or_checkpoint: dict | str | Path) -> Path:
        """The folder of a checkpoint's audit: ``<audits>/<checkpoint folder name>``, ``org--name`` for a hub name."""
        if isinstance(audit_or_checkpoint, dict):
            return self.audits / recorded_name(audit_or_checkpoint["model"])
        return self.audits / checkpoint_name(audit_or_checkpoint)

    def check(self) -> None:
        """Refuse missing checkpoints and data files before any audit starts."""
        for checkpoint in self.checkpoints:
            resolve_checkpoint(checkpoint)
        for name in PATH_PARAMETERS:
            value = getattr(self, name)
            if value and not Path(value).is_file():
                raise UserError(f"{name}: text file not found: {value}")

    def load_audits(self) -> list[dict]:
        """The audit of every checkpoint, run or reused, in the order given."""
        if self._audits is None:
            self.check()
            self._audits = [
                ensure_audit(self.settings(c), self.audit_dir(c))
                for c in progress_bar(self.checkpoints, desc="audits", unit="checkpoint", disable=not self.progress)
            ]
        return self._audits

    def explorer(self, checkpoint: str | Path) -> Explorer:
        """``checkpoint`` opened for exploration (``explore.Explorer``: its eval capture, reused from the shared
        cache when an audit or an earlier explorer made it), when first asked for, then kept."""
        checkpoint = checkpoint_key(checkpoint)
        if checkpoint not in self._explorers:
            resolve_checkpoint(checkpoint)
            self._explorers[checkpoint] = Explorer(self.settings(checkpoint))
        return self._explorers[checkpoint]

    def finished_audits(self) -> list[Path]:
        """The audit folders of this run's checkpoints whose ``audit.json`` is current for these settings."""
        return [self.audit_dir(c) for c in self.checkpoints if audit_is_current(self.settings(c), self.audit_dir(c))]

    def write_table(self, table: pd.DataFrame) -> Styler:
        """Write a table (a ``tables`` DataFrame) as CSV, Markdown and LaTeX under ``<out>/tables``; returns its
        ``Styler``, which the notebook displays."""
        write_table(table, self.out)
        return styled(table)

    def caption(self) -> str:
        """What this run's figures were drawn from (``audit_caption`` of its audits, once they are loaded)."""
        return audit_caption(self._audits or [])

    def write_figure(self, fig: go.Figure, name: str, caption: str | None = None) -> dict[str, Path]:
        """Write a figure under ``<out>/figures`` (``figures.write_figure``), captioned with ``caption`` or what
        this run audited."""
        return write_figure(fig, self.out, name, caption if caption is not None else self.caption())

    def figure(self, fig: go.Figure, name: str, caption: str | None = None) -> None:
        """Write a figure (``write_figure``) and display it, its PNG kept beside it for readers without plotly."""
        show(fig, self.write_figure(fig, name, caption).get("png"))
