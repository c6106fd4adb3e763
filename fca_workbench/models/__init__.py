"""The model families, registered with the Auto classes so ``from_pretrained`` resolves them offline."""

from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM

from ..errors import UserError
from .common import CoefficientLMOutput, CoefficientModel, next_token_nll
from .dense import DenseConfig, DenseForCausalLM
from .featuregate import FeatureGateConfig, FeatureGateForCausalLM
from .muddpythia import MUDDPythiaConfig, MUDDPythiaForCausalLM

FAMILIES = {
    "dense": (DenseConfig, DenseForCausalLM),
    "featuregate": (FeatureGateConfig, FeatureGateForCausalLM),
    "muddpythia": (MUDDPythiaConfig, MUDDPythiaForCausalLM),
}

for _config_class, _model_class in FAMILIES.values():
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    AutoModelForCausalLM.register(_config_class, _model_class, exist_ok=True)


def arch_of(model: CoefficientModel) -> str:
    return next(name for name, (_, cls) in FAMILIES.items() if isinstance(model, cls))


def load_model(path, dtype=None) -> CoefficientModel:
    """Load a workbench checkpoint folder, turning every way it can be broken into one-line UserErrors."""
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"checkpoint folder not found: {folder}")
    if not (folder / "config.json").is_file():
        raise UserError(f"not a checkpoint folder (no config.json): {folder}")
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, OSError, KeyError) as exc:
        raise UserError(f"unreadable checkpoint config in {folder}: {_first_line(exc)}") from None
    if not isinstance(config, tuple(cfg for cfg, _ in FAMILIES.values())):
        raise UserError(f"{folder} holds a '{config.model_type}' model, not one of {sorted(FAMILIES)}")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder, config=config, local_files_only=True, dtype=dtype or "float32"
        )
    except Exception as exc:  # safetensors, torch and transformers each raise their own types on bad weights
        raise UserError(f"corrupt or missing weights in {folder}: {_first_line(exc)}") from None
    return model.eval()


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
