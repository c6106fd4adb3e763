"""FCA workbench: frozen-controller auditing of dynamic-parameterized Transformers."""

from .models import FAMILIES, CoefficientLMOutput, load_model  # noqa: F401  (registers the Auto classes)

__version__ = "0.1.0"
