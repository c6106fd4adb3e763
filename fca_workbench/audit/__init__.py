"""The method: capture, conditions, replay, figures and execution, and the audit line that runs them in order.

``run.run_audit`` is the straight line (settings → inputs → capture → profiles → replay per condition →
metrics → execution → verdicts → write); every other module here is one of its steps.
"""

from fca_workbench.audit.run import run_audit
from fca_workbench.audit.settings import AuditSettings

__all__ = ["AuditSettings", "run_audit"]
