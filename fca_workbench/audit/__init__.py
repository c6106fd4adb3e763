"""The method: capture, conditions, replay, figures and execution, and the audit line that runs them in order.

``run.run_audit`` is the straight line (settings → inputs → capture → profiles → replay per condition →
metrics → execution → verdicts → write); every other module here is one of its steps. Both names are imported
when first used (``fca_workbench.foundation.lazy``): the command line builds ``settings.AuditSettings`` without torch.
"""

from typing import TYPE_CHECKING

from fca_workbench.foundation.lazy import lazy_exports

__all__ = ["AuditSettings", "audit_model", "run_audit"]

if TYPE_CHECKING:
    from fca_workbench.audit.run import audit_model, run_audit
    from fca_workbench.audit.settings import AuditSettings
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {"fca_workbench.audit.run": ["audit_model", "run_audit"], "fca_workbench.audit.settings": ["AuditSettings"]},
    )
