"""Seeds are averaged only within one configuration: the digest of a model's config and training settings less
the seed (``checkpoint.configuration``), and the grouping every over-seeds figure uses (``by_configuration``)."""

import hashlib
import json
import shutil
from pathlib import Path

from fca_workbench.foundation.checkpoint import configuration, folder_configuration
from fca_workbench.results.audit_tables import by_configuration

DATA = Path(__file__).resolve().parent.parent / "data"

FEATUREGATES = [DATA / "checkpoints" / f"featuregate-s{seed}" for seed in range(7)]


def test_shipped_featuregate_seeds_are_one_configuration_and_differ_from_moe():
    digests = {folder_configuration(folder) for folder in FEATUREGATES}
    assert len(digests) == 1
    assert digests != {folder_configuration(DATA / "checkpoints" / "moe-s0")}


def test_digest_is_the_config_and_training_settings_less_seed_and_save_metadata():
    config = {"model_type": "fca-featuregate", "n_layer": 4, "transformers_version": "5.0.0", "dtype": "float32"}
    training = {"seed": 3, "lr": 0.003, "steps": 300}
    kept = {"config": {"model_type": "fca-featuregate", "n_layer": 4}, "training": {"lr": 0.003, "steps": 300}}
    independent = hashlib.sha256(json.dumps(kept, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert configuration(config, training) == independent
    assert configuration({**config, "transformers_version": "5.24.0"}, {**training, "seed": 9}) == independent
    assert configuration(config, {**training, "lr": 0.03}) != independent
    assert configuration({**config, "n_layer": 6}, training) != independent
    assert configuration(config, None) != independent  # unknown training is not some training


def test_a_card_with_another_learning_rate_is_another_configuration(tmp_path):
    folder = tmp_path / "featuregate-lr"
    shutil.copytree(FEATUREGATES[0], folder)
    card = json.loads((folder / "model_card.json").read_text())
    card["settings"]["lr"] = card["settings"]["lr"] * 10
    (folder / "model_card.json").write_text(json.dumps(card))
    assert folder_configuration(folder) != folder_configuration(FEATUREGATES[0])
    (folder / "model_card.json").unlink()  # a foreign checkpoint: its config alone
    assert folder_configuration(folder) == configuration(json.loads((folder / "config.json").read_text()))


def audit(name: str, arch: str, digest: str | None) -> dict:
    model = {"path": f"/models/{name}", "hub": None, "arch": arch, "fingerprint": name[-1] * 64}
    return {"model": model if digest is None else {**model, "configuration": digest}}


def test_groups_hold_one_configuration_each_and_say_which():
    a, b = "a" * 64, "b" * 64
    audits = [audit("fg-1", "featuregate", a), audit("fg-2", "featuregate", a), audit("fg-3", "featuregate", b)]
    audits += [audit("moe-4", "mixtral", a), audit("old-5", "dense", None), audit("old-6", "dense", None)]
    groups = {label: [x["model"]["path"] for x in group] for label, group in by_configuration(audits).items()}
    assert groups == {
        "featuregate · config aaaaaaaa": ["/models/fg-1", "/models/fg-2"],
        "featuregate · config bbbbbbbb": ["/models/fg-3"],
        "mixtral": ["/models/moe-4"],
        "dense · old-5": ["/models/old-5"],  # written without a digest: never averaged with another
        "dense · old-6": ["/models/old-6"],
    }
