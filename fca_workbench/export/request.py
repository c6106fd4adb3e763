"""What an export is asked for, checked from its flags alone (no torch): the command line refuses a bad one
before anything heavy is imported, ``export_static`` before anything is loaded."""

from pathlib import Path

from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import condition_named, condition_names


def check_request(profile: str, audit: str | Path | None, calib: str | Path | None, max_windows: int | None) -> None:
    """Refuse, in one line, a profile that is not static, one that differs by position (a static model has one
    set of weights for every position) or by token (a lookup table no plain checkpoint holds), or an audit's profile
    with options for estimating one."""
    profiles, exportable = condition_names(lambda c: c.static), condition_names(lambda c: c.exportable)
    if profile not in profiles:
        raise UserError(f"unknown profile '{profile}'; choose from {', '.join(profiles)}")
    if profile not in exportable:
        why = condition_named(profile).not_exportable
        raise UserError(f"profile '{profile}' {why}: export {', '.join(exportable)}")
    if audit is not None and (calib is not None or max_windows is not None):
        raise UserError("--audit gives the profile its audit saved; --calib and --max-windows are for estimating one")
