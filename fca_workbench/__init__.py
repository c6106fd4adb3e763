"""FCA workbench: frozen-controller auditing of dynamic-parameterized Transformers."""

from fca_workbench.models import FAMILIES, CoefficientLMOutput, load_model  # importing it registers the Auto classes
from fca_workbench.results import load_audit, load_audits  # pandas is imported only when they run

__all__ = ["FAMILIES", "CoefficientLMOutput", "load_audit", "load_audits", "load_model"]
__version__ = "0.1.0"
