"""FCA workbench: frozen-controller auditing of dynamic-parameterized Transformers."""

from .models import FAMILIES, CoefficientLMOutput, load_model  # noqa: F401  (registers the Auto classes)
from .results import load_audit, load_audits  # noqa: F401  (pandas is imported only when they run)

__version__ = "0.1.0"
