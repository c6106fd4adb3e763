"""FCA workbench: frozen-controller auditing of dynamic-parameterized Transformers.

The public names are imported when first used (``fca_workbench.foundation.lazy``): ``import fca_workbench`` imports neither
torch nor transformers. ``load_model`` and ``FAMILIES`` import ``fca_workbench.models``, which registers the
families with transformers' Auto classes.
"""

from typing import TYPE_CHECKING

from fca_workbench.foundation.lazy import lazy_exports

__all__ = ["FAMILIES", "CoefficientLMOutput", "load_audit", "load_audits", "load_model"]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from fca_workbench.models import FAMILIES, CoefficientLMOutput, load_model
    from fca_workbench.results import load_audit, load_audits
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "fca_workbench.models": ["FAMILIES", "CoefficientLMOutput", "load_model"],
            "fca_workbench.results": ["load_audit", "load_audits"],
        },
    )
