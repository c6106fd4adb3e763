"""What one ``fca eval`` run is run with: the audit's settings for the model and its calibration profiles, the
tasks, the static conditions and the document limit.

Plain data, no torch and no lm-eval: the command line builds and checks it before anything heavy is imported, so
an empty ``--tasks`` or a condition that is not static is refused in a blink.
"""

from dataclasses import dataclass, field

from fca_workbench.audit.settings import AuditSettings
from fca_workbench.foundation.errors import UserError
from fca_workbench.results.conditions import LAYER_MEAN, LOW, REFERENCE, condition_names


@dataclass
class EvalSettings:
    audit: AuditSettings  # the model, its calibration windows and batches, as the audit reads (and checks) them
    tasks: list[str]
    # None: every static condition the model replays (a router's top-k ones too: notebook 08)
    conditions: list[str] | None = field(default_factory=lambda: [REFERENCE, LOW, LAYER_MEAN])
    limit: int | None = None  # the first N documents of each task

    def __post_init__(self) -> None:
        if not self.tasks:
            raise UserError("--tasks names no task")
        for condition in self.conditions or ():
            check_eval_condition(condition, "--conditions", "fca eval")


def check_eval_condition(condition: str, flag: str, command: str) -> None:
    """A condition a task's text can be answered under (``eval_conditions``), else one line naming those."""
    taken = eval_conditions()
    if condition not in taken:
        why = "is not a condition" if condition not in condition_names() else "needs a text's own cached values"
        raise UserError(f"{flag}: '{condition}' {why}; {command} takes the static ones: {', '.join(taken)}")


def eval_conditions() -> tuple[str, ...]:
    """The reference (the live model, on any text) and the static conditions: a task's text has no cached
    coefficients."""
    return condition_names(lambda c: c.name == REFERENCE or c.static)


def comma_names(text: str) -> list[str]:
    """``--tasks`` / ``--conditions``: ``a,b`` as ``["a", "b"]``, blanks dropped."""
    return [name.strip() for name in text.split(",") if name.strip()]
