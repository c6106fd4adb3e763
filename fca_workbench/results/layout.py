"""The audit folder's layout: where each file an audit writes lies."""

from __future__ import annotations

from pathlib import Path


def cache_folder(audit: dict, audit_dir, split: str = "eval") -> Path:
    """Where the audit's coefficient cache of ``split`` lies (its ``--cache``, else beside audit.json)."""
    root = audit["settings"].get("cache")
    return (Path(root) if root else Path(audit_dir) / "cache") / split
