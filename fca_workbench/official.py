"""The official MUDDPythia release layout under its short import path: ``save_official`` writes a model in it
(``models.official_layout``), the strict loader reads it (``models.loading``)."""

from fca_workbench.models.loading import OFFICIAL_1P4B_CONFIG, OFFICIAL_AUTO_MAP, check_weights, read_config
from fca_workbench.models.official_layout import save_official

__all__ = ["OFFICIAL_1P4B_CONFIG", "OFFICIAL_AUTO_MAP", "check_weights", "read_config", "save_official"]
