"""The on-disk contract of an audit: its folder's layout, ``audit.json``'s schema, the per-token files, the
verdicts and report text, and the DataFrames, tables and figures read back from them.

Nothing here runs a model: every value comes from an audit's files (or a dict of ``audit.json``).
"""

from fca_workbench.results.frames import load_audit, load_audits

__all__ = ["load_audit", "load_audits"]
