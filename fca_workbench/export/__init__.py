"""``fca export``: a checkpoint whose controller is gone, one static profile folded into its weights.

The profile comes from a finished audit (its saved ``static_profiles.safetensors``, checked against this
checkpoint's fingerprint) or is estimated from calibration text as the audit estimates it; each family's
folding lives in its own module (``native``: FeatureGate → GPT-2, MUDDPythia → static MUDDPythia;
``experts``: MoE routers → K experts taken by every token). The exported model computes what the audit's
replay of that profile computes, so its NLL on the audit's eval windows is the audit's NLL for the profile.

``export_static`` is imported when first used (``fca_workbench.foundation.lazy``); ``request`` checks what an export is
asked for without torch, so ``fca export`` refuses a bad ``--profile`` before anything heavy is imported.
"""

from typing import TYPE_CHECKING

from fca_workbench.foundation.lazy import lazy_exports

__all__ = ["export_static"]

if TYPE_CHECKING:
    from fca_workbench.export.static import export_static
else:
    __getattr__, __dir__ = lazy_exports(__name__, {"fca_workbench.export.static": ["export_static"]})
