"""What an export is asked for, checked from its flags alone (no torch): the command line refuses a bad one
before anything heavy is imported, ``export_static`` before anything is loaded."""

from pathlib import Path

from fca_workbench.errors import UserError
from fca_workbench.results.conditions import PROFILE_CONDITIONS


def check_request(profile: str, audit: str | Path | None, calib: str | Path | None, max_windows: int | None) -> None:
    """Refuse, in one line, a profile that is not static or an audit's profile with options for estimating one."""
    if profile not in PROFILE_CONDITIONS:
        raise UserError(f"unknown profile '{profile}'; choose from {', '.join(PROFILE_CONDITIONS)}")
    if audit is not None and (calib is not None or max_windows is not None):
        raise UserError("--audit gives the profile its audit saved; --calib and --max-windows are for estimating one")
