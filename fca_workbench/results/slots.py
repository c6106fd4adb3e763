"""Readable names of a controller's coefficient slots, for tables, heatmaps and the dashboard.

The names are declared once, by each model family (``slot_labels_for``) and each controller kind
(``ControllerKind.slot_labels``); an audit records its model's in ``model.slot_labels``. What is here only
reads them.
"""

from __future__ import annotations

from collections.abc import Iterable

from fca_workbench.adapters.kinds import expert_slot_labels
from fca_workbench.models import family_slot_labels


def slot_labels(slot_shape: Iterable[int], arch: str, router: bool = False) -> list[str]:
    """The names of a layer's flattened slots from its shape and the model's ``arch`` (for readers that hold
    no model and no recorded labels: the explorer, audits written before ``model.slot_labels``): a router's
    dense gate ``expert 0``, ..., else what the family declares (generic ``slot i`` for other archs)."""
    shape = tuple(slot_shape)
    return expert_slot_labels(shape) if router else family_slot_labels(arch, shape)


def audit_slot_labels(audit: dict, layer: int, slot_shape: Iterable[int]) -> list[str]:
    """Controller ``layer``'s slot names as the audit recorded them (``model.slot_labels``), else derived
    from its shape (``slot_labels``)."""
    recorded = audit["model"].get("slot_labels")
    if recorded is not None:
        return list(recorded[layer])
    router = routers(audit)
    return slot_labels(slot_shape, audit["model"]["arch"], layer < len(router) and router[layer])


def routers(audit: dict) -> list[bool]:
    """Per controller of the audited model: is it a router (its coefficient a dense gate over the experts)."""
    names = set((audit["execution"].get("experts") or {}).get("controllers", []))
    return [name in names for name in audit["model"].get("controllers", [])]
