"""The layout of the folders the workbench writes: every file and folder name, spelled here only.

An audit folder (``fca audit --out``) holds its marker (``OUTPUT_MARKER``, written before anything else, so
only a folder the workbench made is ever written over), its lock, ``audit.json``, the per-token NLL files, the static profiles and,
unless ``--cache`` points elsewhere, the coefficient caches under ``cache/<split>``. ``fca audit-many`` adds
its marker and ``audit_many.json`` beside its audit folders. A results folder of ``fca reproduce`` carries the marker file,
its config and index, the audits under ``audits/`` (each with its ``provenance.json``), and the notebooks'
``notebooks/``, ``tables/`` and ``figures/``; a run split with ``--shard K/N`` (either command) adds one record
per finished shard under ``shards/``. The coefficient cache's own files (manifest, shards) are
``audit.capture``'s; its lock, like an output folder's, is ``LOCK_FILE``; the cache root also remembers the
fingerprints of the checkpoints audited there (``FINGERPRINT_MEMO``, ``audit.fingerprint_memo``).
A study folder (``studies/controller_design.py --out``) holds one folder per run: its summary and the model
card of its checkpoint (``checkpoint.TRAIN_CARD_FILE``).
"""

from __future__ import annotations

from pathlib import Path

AUDIT_FILE = "audit.json"
PER_TOKEN_CSV = "per_token_nll.csv.gz"
PER_TOKEN_PARQUET = "per_token_nll.parquet"
PROFILES_FILE = "static_profiles.safetensors"
CACHE_DIR = "cache"
AUDIT_MANY_FILE = "audit_many.json"
FINETUNE_FOLDER = "finetune"  # in the router study folder: its fine-tune stage, one folder per fine-tune
FINETUNE_SUMMARY_FILE = "finetune_summary.json"  # in each: the fine-tune's figures
DOWNSTREAM_FILE = "downstream.json"  # beside audit.json: fca eval's task accuracies under the conditions
OUTPUT_MARKER = ".fca-output"  # first in every fca audit / audit-many folder: the command that wrote it
LOCK_FILE = ".fca-audit.lock"  # in an output or cache folder while an audit (or run) writes there
FINGERPRINT_MEMO = "model_fingerprints.json"  # in a cache root: checkpoints' fingerprints by file identity

PROVENANCE_FILE = "provenance.json"  # beside a reproduce run's audit.json: what it was computed from
RESULTS_MARKER = ".fca-results"  # written first into every fca reproduce folder
REPRODUCE_CONFIG_FILE = "reproduce_config.json"
INDEX_FILE = "README.md"
AUDITS_DIR = "audits"
NOTEBOOKS_DIR = "notebooks"
TABLES_DIR = "tables"
FIGURES_DIR = "figures"
STAGING_DIR = ".notebook-files"  # <name>/ in it: one running notebook's tables and figures, moved up when it ends

SHARDS_DIR = "shards"  # in an audit-many or reproduce folder: one record per finished --shard K/N


def shard_record_file(index: int, count: int) -> str:
    """The record of shard ``index`` of ``count`` in ``SHARDS_DIR``."""
    return f"{index}-of-{count}.json"


STUDY_SUMMARY_FILE = "audit_summary.json"  # in each run folder of a study (studies/controller_design.py)


def cache_root(cache: str | Path | None, audit_dir: str | Path | None) -> Path:
    """The folder of an audit's coefficient caches: its ``cache`` setting (``--cache``), else ``cache/``
    beside its ``audit.json`` (an explorer, which writes no audit folder, always names its cache)."""
    if cache:
        return Path(cache)
    if audit_dir is None:
        raise ValueError("the coefficient caches need settings.cache or an output folder")
    return Path(audit_dir) / CACHE_DIR


def split_cache(cache: str | Path | None, audit_dir: str | Path | None, split: str) -> Path:
    """The coefficient cache of one data split (``eval``, ``calibration``) under ``cache_root``."""
    return cache_root(cache, audit_dir) / split


def audit_cache_root(audit: dict, audit_dir: str | Path) -> Path:
    """The cache root of a finished audit (its ``audit.json`` as a dict)."""
    return cache_root(audit["settings"].get("cache"), audit_dir)


def cache_folder(audit: dict, audit_dir: str | Path, split: str = "eval") -> Path:
    """Where the coefficient cache of ``split`` of a finished audit (its ``audit.json`` as a dict) lies."""
    return audit_cache_root(audit, audit_dir) / split
