"""The on-disk contract of an audit: its folder's layout, ``audit.json``'s schema, the per-token files, the
verdicts and report text, and the DataFrames, tables and figures read back from them.

Nothing here runs a model: every value comes from an audit's files (or a dict of ``audit.json``).
``load_audit`` and ``load_audits`` are imported when first used (``fca_workbench.foundation.lazy``), so the command line
reads the condition vocabulary and folder layout without pandas.
"""

from typing import TYPE_CHECKING

from fca_workbench.foundation.lazy import lazy_exports

__all__ = ["load_audit", "load_audits"]

if TYPE_CHECKING:
    from fca_workbench.results.frames import load_audit, load_audits
else:
    __getattr__, __dir__ = lazy_exports(__name__, {"fca_workbench.results.frames": ["load_audit", "load_audits"]})
