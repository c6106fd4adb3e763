"""What one ``fca train`` run is run with: the model (a workbench family and its sizes, or a transformers
config), the data, the optimizer's schedule, checkpoints and mini-audits.

Plain data, no torch: the command line builds and checks it before anything heavy is imported, so a FeatureGate
flag given to another model is refused in a blink.
"""

import math
from dataclasses import dataclass

from fca_workbench.foundation.errors import UserError

NORMED, DETACHED = "normed", "detached"
ROUTER_INPUTS = (NORMED, DETACHED)  # a router reads the family's own normed hidden state, or it without its gradient


@dataclass
class TrainSettings:
    arch: str | None = None  # a workbench family, or None with hf_config
    hf_config: dict | None = None  # a transformers config's fields, model_type included (see read_hf_config)
    init: str | None = None  # a transformers checkpoint folder the run starts from; hf_config: its config's fields
    seed: int = 0
    train_data: str | None = None  # any UTF-8 text or JSONL; default: the shipped train split
    layers: int | None = 4  # layers, width, heads and gate_groups shape arch models; hf_config has its own
    width: int | None = 96
    heads: int | None = 4
    gate_groups: int | None = None
    gate_range: str | None = None  # FeatureGate only (None: the config's default, 2sigmoid)
    gate_input: str | None = None  # FeatureGate only (None: the config's default, normed)
    window: int = 256
    steps: int = 300
    batch_size: int = 16
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.1
    controller_weight_decay: float | None = None  # the controllers' weights (None: weight_decay)
    controller_lr_mult: float = 1.0  # the controllers' learning rate is lr times this
    router_z_loss: float = 0.0  # a transformers MoE's weight on the router z-loss (training/routing.py)
    router_input: str = NORMED  # a transformers MoE's router input (ROUTER_INPUTS)
    freeze_routers: bool = False  # a transformers MoE's routers keep their weights (a static export stays static)
    save_every: int = 100
    eval_windows: int = 64
    device: str = "cpu"
    audit_every: int | None = None  # mini-audit every N steps and at the end (training_audit.py)
    audit_windows: int = 16

    def __post_init__(self):
        if (self.arch is None) == (self.hf_config is None):
            raise UserError("give exactly one of --arch and --hf-config")
        if self.init is not None and self.hf_config is None:
            raise UserError("--init needs the fields of its checkpoint's config (training.hf_config.read_init_config)")
        if self.hf_config is not None:
            self.layers = self.width = self.heads = self.gate_groups = None
        design = [k for k in ("gate_range", "gate_input") if getattr(self, k) is not None]
        if design and self.arch != "featuregate":
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in design)
            raise UserError(f"{flags} shape FeatureGate controllers; {self.name} has none")
        if not (math.isfinite(self.controller_lr_mult) and self.controller_lr_mult > 0):
            raise UserError(f"--controller-lr-mult must be a positive number, got {self.controller_lr_mult}")
        if not (math.isfinite(self.router_z_loss) and self.router_z_loss >= 0):
            raise UserError(f"--router-z-loss must be 0 or more, got {self.router_z_loss}")
        if self.router_input not in ROUTER_INPUTS:
            raise UserError(f"--router-input must be one of {', '.join(ROUTER_INPUTS)}, got {self.router_input!r}")
        routing = [flag for flag, given in self.router_flags().items() if given]
        if routing and self.arch is not None:
            raise UserError(f"{', '.join(routing)} shape the routers of a --hf-config MoE; {self.name} has none")
        if self.controller_weight_decay is not None and not (
            math.isfinite(self.controller_weight_decay) and self.controller_weight_decay >= 0
        ):
            raise UserError(f"--controller-weight-decay must be 0 or more, got {self.controller_weight_decay}")

    def warmup_warning(self) -> str | None:
        """One line when the warm-up is not shorter than the run: its learning rate then never reaches the
        cosine phase, which nothing else would show."""
        if self.warmup < self.steps:
            return None
        return (
            f"the warm-up (--warmup {self.warmup}) outlasts the run (--steps {self.steps}): the learning rate only "
            f"rises and never decays; give --warmup below {self.steps}"
        )

    def router_flags(self) -> dict[str, bool]:
        """Each router-design flag and whether it asks for something other than the model's own routing."""
        return {
            "--router-z-loss": self.router_z_loss != 0,
            "--router-input": self.router_input != NORMED,
            "--freeze-routers": self.freeze_routers,
        }

    @property
    def name(self) -> str:
        if self.arch:
            return self.arch
        assert self.hf_config is not None  # __post_init__: exactly one of the two
        return self.hf_config["model_type"]
