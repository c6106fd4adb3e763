"""Readable names of a controller's coefficient slots, for tables, heatmaps and the dashboard."""

from __future__ import annotations


def slot_labels(slot_shape, arch: str, router: bool = False) -> list[str]:
    """Readable names of a layer's slots: FeatureGate ``attn g0``/``mlp g0``, MUDDPythia ``q←0`` (stream ← source),
    a router's dense gate ``expert 0``, ..."""
    import itertools

    if router:
        return [f"expert {e}" for e in range(slot_shape[0])]
    if arch == "featuregate" and len(slot_shape) == 2 and slot_shape[0] == 2:
        return [f"{branch} g{g}" for branch in ("attn", "mlp") for g in range(slot_shape[1])]
    if arch == "muddpythia" and len(slot_shape) == 2:
        streams = "qkvr" if slot_shape[0] == 4 else "r" if slot_shape[0] == 1 else None
        if streams:
            return [f"{s}←{j}" for s in streams for j in range(slot_shape[1])]
    return [",".join(map(str, idx)) for idx in itertools.product(*(range(n) for n in slot_shape))]


def routers(audit: dict) -> list[bool]:
    """Per controller of the audited model: is it a router (its coefficient a dense gate over the experts)."""
    names = set((audit["execution"].get("experts") or {}).get("controllers", []))
    return [name in names for name in audit["model"].get("controllers", [])]
