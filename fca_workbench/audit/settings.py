"""What one audit is run with: the settings every surface (``fca audit``, ``fca eval``, ``fca export``, the
notebooks' ``NotebookRun``, ``fca reproduce``, the explorer, the dashboard, the mini-audit) hands to the replay
session, declared once. Every surface's defaults are read from here (``default``); the paper run's two
departures from them (``PAPER_RUN``) too.

Plain data, no torch: the command line builds and range-checks it before anything heavy is imported, so a bad
flag is refused in a blink.
"""

from dataclasses import asdict, dataclass
from typing import Any

from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.flags import declared_default

DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the dtypes a model is loaded in (session.DTYPES maps them)

# may differ between nodes; contents are compared
PATH_SETTINGS = ("checkpoint", "eval", "calibration", "cache", "offload_folder")

DEFAULT_WINDOW = 256  # tokens per window when none is given (or the model's context, if shorter)
CPU_BATCH_SIZE = 16  # windows per batch on CPU when none is given (on CUDA: fitted to free memory)

SETTINGS_MINIMA = {"window": 2, "max_windows": 1, "batch_size": 1, "seed": 0, "resamples": 1, "latency_repeats": 1}


@dataclass
class AuditSettings:
    checkpoint: str
    eval: str | None = None
    calibration: str | None = None
    window: int | None = None
    max_windows: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    batch_size: int | None = None  # None: CPU_BATCH_SIZE on CPU, fitted to free memory on CUDA (budget)
    resamples: int = 1000
    latency_repeats: int = 10
    cache: str | None = None
    controllers: str | None = None  # regex naming more of a foreign model's controllers, beside the built-in kinds
    only_controllers: str | None = None  # regex naming a foreign model's controllers, instead of the built-in kinds
    trust_remote_code: bool = False  # run the code a foreign checkpoint folder ships (never by default)
    per_layer: bool = False  # also every condition at each layer alone (``per_layer`` rows, sweep.py)
    device_map: str | None = None  # big-model inference (adapters/placement.py): auto, balanced, sequential, FILE.json
    max_memory: str | None = None  # what each device may hold, as --max-memory gives it (cpu=200MB,0=10GiB)
    offload_folder: str | None = None  # where a fresh folder of offloaded weights is made (default: the temp folder)

    def __post_init__(self) -> None:
        """A number out of range or an unknown dtype is one line here, whatever gave it (flags, a reproduce
        config, Python): never a ``ZeroDivisionError`` or a silent default later."""
        for name, least in SETTINGS_MINIMA.items():
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
                raise UserError(f"{name} must be a whole number of at least {least}, got {value!r}")
        if self.dtype not in DTYPE_NAMES:
            raise UserError(f"unknown dtype '{self.dtype}'; choose from {sorted(DTYPE_NAMES)}")

    def without_paths(self) -> dict:
        """The settings that must agree between the processes or nodes of one run (``PATH_SETTINGS`` aside)."""
        return {k: v for k, v in asdict(self).items() if k not in PATH_SETTINGS}


# What ``fca reproduce`` and the paper notebooks run with where the audit's own defaults would take too long or
# show too little: 64 evenly spread windows of each set (a full FeatureGate audit of 727 windows takes 3-4 min on
# the 2-core reference machine, and the run audits eleven checkpoints), with the per-layer sweep.
PAPER_RUN = {"max_windows": 64, "per_layer": True}


def default(name: str) -> Any:
    """The declared default of setting ``name``: what every surface offers when the user gives none."""
    return declared_default(AuditSettings, name)


def paper_default(name: str) -> Any:
    """The default of ``name`` in the paper run (``PAPER_RUN``, else the audit's own)."""
    return PAPER_RUN[name] if name in PAPER_RUN else default(name)
