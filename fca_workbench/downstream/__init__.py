"""``fca eval``: downstream tasks under FCA conditions, through lm-evaluation-harness (the ``eval`` extra).

``frozen`` turns a condition into logits (the live model, or the frozen model fed a static profile of the
calibration set); ``lm`` is lm-eval's Hugging Face model answering with those logits; ``run`` runs the tasks
and writes ``downstream.json``. Only ``lm`` and ``run`` import lm-eval, so the rest of the workbench runs
without it.
"""

import importlib
import os
import types

from fca_workbench.foundation.errors import UserError

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}  # a task's data comes from disk, never the network


def require_lm_eval() -> types.ModuleType:
    """lm-eval, imported offline (unless the environment says otherwise), or one line saying how to get it."""
    datasets_offline = "HF_DATASETS_OFFLINE" not in os.environ
    for name, value in OFFLINE.items():
        os.environ.setdefault(name, value)
    try:
        module = importlib.import_module("lm_eval")
    except ImportError:
        raise UserError(
            "fca eval needs lm-evaluation-harness: pip install 'fca-workbench[eval]' (or lm-eval>=0.4.13)"
        ) from None
    if datasets_offline:  # datasets reads the variable once, when first imported: maybe before this call
        config = importlib.import_module("datasets.config")
        for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            setattr(config, flag, True)
    return module
