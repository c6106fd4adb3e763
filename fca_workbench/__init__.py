"""FCA workbench: frozen-controller auditing of dynamic-parameterized Transformers.

The public names are imported when first used (``fca_workbench.foundation.lazy``): ``import fca_workbench`` imports neither
torch nor transformers. ``run_audit`` audits a checkpoint folder, ``audit_model`` a model held in memory;
``register_condition`` (or the ``condition`` decorator) adds a condition every surface replays. ``load_model`` and
``FAMILIES`` import ``fca_workbench.models``, which registers the
families with transformers' Auto classes.
"""

from typing import TYPE_CHECKING

from fca_workbench.foundation.lazy import lazy_exports

__all__ = [
    "FAMILIES",
    "Assignment",
    "Condition",
    "CoefficientLMOutput",
    "audit_model",
    "condition",
    "load_audit",
    "load_audits",
    "load_model",
    "register_condition",
    "run_audit",
]
__version__ = "0.1.0"

if TYPE_CHECKING:
    from fca_workbench.audit.run import audit_model, run_audit
    from fca_workbench.models import FAMILIES, CoefficientLMOutput, load_model
    from fca_workbench.results import load_audit, load_audits
    from fca_workbench.results.conditions import Assignment, Condition, condition, register_condition
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "fca_workbench.models": ["FAMILIES", "CoefficientLMOutput", "load_model"],
            "fca_workbench.results": ["load_audit", "load_audits"],
            "fca_workbench.audit.run": ["audit_model", "run_audit"],
            "fca_workbench.results.conditions": ["Assignment", "Condition", "condition", "register_condition"],
        },
    )
