"""``fca export``: a checkpoint with its controller folded away into one static profile.

The exported folder is loaded with plain ``from_pretrained`` and scored on the audit's own eval windows (rebuilt
from ``audit.json`` and checked against its fingerprint): its NLL must be the audit's NLL for the profile, which
the audit computed by frozen replay of the original model, an independent computation.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import zoo
from conftest import assert_one_line_error, fca, tiny_model
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from test_hub import COMMIT, cache_snapshot, offline_cache  # noqa: F401 (offline_cache: a fixture used here)
from transformers import AutoModelForCausalLM, AutoTokenizer

from fca_workbench.adapters import COEFFICIENT, TransformersControlled
from fca_workbench.audit import session as session_module
from fca_workbench.audit.inputs import CALIBRATION
from fca_workbench.audit.run import AuditSettings, run_audit
from fca_workbench.data.corpus import split_path
from fca_workbench.data.windows import load_windows, read_documents
from fca_workbench.export import export_static
from fca_workbench.export.experts import fold_routers
from fca_workbench.export.native import featuregate_to_gpt2
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.fingerprints import fingerprint_tensor
from fca_workbench.foundation.resources import checkpoints_dir
from fca_workbench.models import next_token_nll
from fca_workbench.models.muddpythia import MUDDPythiaConfig, MUDDPythiaForCausalLM

TEXT_CHARS = 6000  # of each shipped split: a few windows of 32 tokens, tokenized in milliseconds
AUDIT = dict(max_windows=2, batch_size=2, resamples=20, latency_repeats=1)  # the window export uses: min(256, context)
NATIVE_PROFILES = ("global_mean", "layer_scalar", "layer_mean")
ROUTER_PROFILES = ("layer_mean_topk", "layer_mean", "global_mean")
MODELS = ["featuregate", "muddpythia", "moe-s0", "olmoe", "qwen2_moe", "qwen3_moe"]


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> dict[str, Path]:
    """Short eval and calibration files cut from the shipped splits."""
    folder = tmp_path_factory.mktemp("texts")
    paths = {}
    for split in ("eval", "calibration"):
        paths[split] = folder / f"{split}.txt"
        paths[split].write_text(read_documents(split_path(split))[0][:TEXT_CHARS], encoding="utf-8")
    return paths


@pytest.fixture(scope="module")
def checkpoints(tokenizer, tmp_path_factory) -> dict[str, Path]:
    """The shipped FeatureGate, MUDDPythia and MoE (trained: their profiles differ by more than the test's
    tolerance) and three tiny zoo MoE families."""
    root = tmp_path_factory.mktemp("zoo")
    folders = {name: checkpoints_dir() / f"{name}-s0" for name in ("featuregate", "muddpythia")}
    folders["moe-s0"] = checkpoints_dir() / "moe-s0"
    for model_type in ("olmoe", "qwen2_moe", "qwen3_moe"):
        folders[model_type] = zoo.save(zoo.build(model_type), root / model_type, tokenizer)
    return folders


@pytest.fixture(scope="module")
def audits(checkpoints, texts, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("audits")
    out = {}
    for name, folder in checkpoints.items():
        settings = AuditSettings(str(folder), eval=str(texts["eval"]), calibration=str(texts["calibration"]), **AUDIT)
        run_audit(settings, root / name)
        out[name] = root / name
    return out


def audit_json(audit: Path) -> dict:
    return json.loads((audit / "audit.json").read_text())


def exported_nll(folder: Path, audit: dict) -> float:
    """The exported model's NLL on the audit's eval windows, as the audit averages it (per window, then over
    windows), with plain transformers."""
    data = audit["data"]["eval"]
    windows = load_windows(data["source"], AutoTokenizer.from_pretrained(folder), data["window"], data["windows"])
    assert fingerprint_tensor(windows) == data["fingerprint"]
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        return next_token_nll(model(windows).logits, windows).double().mean(dim=1).mean().item()


@pytest.mark.parametrize("name", MODELS)
def test_exported_nll_is_the_audits_nll_for_the_profile(name, checkpoints, audits, tmp_path):
    audit = audit_json(audits[name])
    profiles = ROUTER_PROFILES if name not in ("featuregate", "muddpythia") else NATIVE_PROFILES
    for profile in profiles:
        out = export_static(checkpoints[name], profile, tmp_path / profile, audit=audits[name])
        assert exported_nll(out, audit) == pytest.approx(audit["conditions"][profile]["nll"], abs=1e-5, rel=0)
    # the tolerance tells the profiles apart (they lie more than twice it apart): each export matched its own
    nlls = sorted(audit["conditions"][p]["nll"] for p in (*profiles, "unperturbed"))
    assert min(b - a for a, b in zip(nlls, nlls[1:])) > 2e-5


@pytest.mark.parametrize("name", ["featuregate", "moe-s0"])
def test_calibration_text_gives_the_audits_profile(name, checkpoints, audits, texts, tmp_path):
    """``--calib``: the profile estimated as the audit estimates it, from the same windows."""
    audit = audit_json(audits[name])
    profile = "layer_mean_topk" if name == "moe-s0" else "layer_mean"
    out = export_static(
        checkpoints[name], profile, tmp_path / "out", calib=texts["calibration"], max_windows=AUDIT["max_windows"]
    )
    assert exported_nll(out, audit) == pytest.approx(audit["conditions"][profile]["nll"], abs=1e-5, rel=0)
    card = json.loads((out / "export_card.json").read_text())
    assert card["calibration"]["fingerprint"] == audit["data"]["calibration"]["fingerprint"]


def test_featuregate_exports_a_gpt2_that_loads_without_the_workbench(checkpoints, audits, tmp_path):
    out = tmp_path / "gpt2"
    result = fca(
        "export", checkpoints["featuregate"], "--profile", "layer_mean", "--audit", audits["featuregate"], "--out", out
    )
    assert result.returncode == 0 and f"wrote {out}" in result.stdout, result.stderr
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"
    ids = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(0))
    script = (
        "import sys, torch; sys.modules['fca_workbench'] = None\n"  # any import of the workbench fails
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        f"folder = {str(out)!r}\n"
        "AutoTokenizer.from_pretrained(folder)\n"
        "model = AutoModelForCausalLM.from_pretrained(folder).eval()\n"
        f"ids = torch.tensor({ids.tolist()})\n"
        "print(type(model).__name__, model(ids).logits.double().sum().item())\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    name, total = result.stdout.split()
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(out)(ids).logits.double().sum().item()
    assert name == "GPT2LMHeadModel" and float(total) == pytest.approx(expected, rel=1e-9)


def test_muddpythia_exports_a_static_cross_layer_model(checkpoints, audits, tmp_path):
    out = export_static(checkpoints["muddpythia"], "layer_mean", tmp_path / "static", audit=audits["muddpythia"])
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "muddpythia" and config["dynamic_dense"] is False
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.controllers == [] and not any(k.startswith("dynamic_dense.") for k in model.state_dict())
    saved = load_file(audits["muddpythia"] / "static_profiles.safetensors")
    for i, bias in enumerate(model.dense_bs):
        assert torch.equal(bias, saved[f"layer_mean.layer_{i}"])


def test_a_static_muddpythia_mixes_with_dense_bs_alone():
    config = MUDDPythiaConfig(vocab_size=64, n_layer=2, n_head=4, dim=64, block_size=16, dynamic_dense=False)
    torch.manual_seed(0)
    model = MUDDPythiaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 16))
    given = [bias.expand(2, 16, *bias.shape) for bias in model.dense_bs]
    assert model.controllers == [] and model.coefficient_slot_shapes == []
    dynamic = MUDDPythiaForCausalLM(MUDDPythiaConfig(**{**config.to_dict(), "dynamic_dense": True})).eval()
    dynamic.load_state_dict(model.state_dict(), strict=False)
    assert torch.equal(model(ids).logits, dynamic(ids, coefficients=given).logits)


def test_top_k_export_keeps_k_experts_that_every_token_takes(checkpoints, audits, tmp_path):
    audit = audit_json(audits["moe-s0"])
    out = export_static(checkpoints["moe-s0"], "layer_mean_topk", tmp_path / "topk", audit=audits["moe-s0"])
    config = json.loads((out / "config.json").read_text())
    source = json.loads((checkpoints["moe-s0"] / "config.json").read_text())
    k = source["num_experts_per_tok"]
    assert config["num_local_experts"] == config["num_experts_per_tok"] == k < source["num_local_experts"]
    model = AutoModelForCausalLM.from_pretrained(out)
    for layer in model.model.layers:
        assert not layer.mlp.gate.weight.any()  # zero logits: every token takes all k, weight 1/k each
    card = json.loads((out / "export_card.json").read_text())
    assert card["experts"] == {"kept": k, "source": source["num_local_experts"]}
    readme = (out / "README.md").read_text()
    retention = audit["retention"]["layer_mean_topk"]["value"]
    assert audit["model"]["fingerprint"] in readme and f"{retention:.4f}" in readme and "layer_mean_topk" in readme


def test_refusals_are_one_line_and_write_nothing(checkpoints, audits, tmp_path):
    featuregate = checkpoints["featuregate"]
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep me")
    cases = [
        (["--profile", "layer_position_mean", "--audit", audits["featuregate"]], "depends on the position"),
        (
            ["--profile", "layer_mean_topk", "--audit", audits["featuregate"]],
            "only for models whose controllers are top-k routers",
        ),
        (["--profile", "layer_mean", "--audit", audits["muddpythia"]], "of another model"),
        (["--profile", "correct"], "unknown profile"),
        (["--profile", "layer_mean", "--audit", audits["featuregate"], "--max-windows", "2"], "--audit gives"),
    ]
    for args, words in cases:
        assert_one_line_error(fca("export", featuregate, *args, "--out", tmp_path / "new"), words)
        assert not (tmp_path / "new").exists()
    result = fca("export", featuregate, "--profile", "layer_mean", "--audit", audits["featuregate"], "--out", taken)
    assert_one_line_error(result, "not an empty folder")
    assert [p.name for p in taken.iterdir()] == ["mine.txt"] and (taken / "mine.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    "checkpoint, words", [("ssm-s0", "mamba2 model"), ("dense-s0", "no controller")], ids=["ssm", "dense"]
)
def test_models_it_cannot_fold_are_refused(checkpoint, words, tmp_path):
    with pytest.raises(UserError, match=words):
        export_static(checkpoints_dir() / checkpoint, "layer_mean", tmp_path / "out", max_windows=1)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("threshold", [None, 0.0, 10.0], ids=["no-skip", "below-every-gate", "above-every-gate"])
def test_featuregate_fold_equals_the_replay_of_constant_gates(threshold):
    """The GPT-2 of ``featuregate_to_gpt2`` against FeatureGate's own replay of the same constant gates,
    with the positive control's ``skip_threshold`` (an MLP whose gates all fall below it is skipped)."""
    model = tiny_model("featuregate")
    model.config.skip_threshold = threshold
    gates = [torch.rand(2, model.config.gate_groups, generator=torch.Generator().manual_seed(i)) * 2 for i in range(2)]
    ids = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        replayed = model(ids, coefficients=[g.expand(3, 16, *g.shape) for g in gates]).logits
        folded = featuregate_to_gpt2(model, gates)(ids).logits
    assert torch.allclose(folded, replayed, atol=1e-5, rtol=0)
    if threshold == 10.0:  # every MLP skipped: the folded MLP projections are zero
        assert not featuregate_to_gpt2(model, gates).transformer.h[0].mlp.c_proj.weight.any()


def test_layers_keeping_fewer_experts_are_padded_with_silent_ones():
    """Static gates that keep 3 experts at one layer and 1 at the other: K = 3, the second layer padded with
    two all-zero experts; logits as the replay's static mixture of the same gates."""
    controlled = TransformersControlled(zoo.build("mixtral"))
    gates = [torch.tensor([0.5, 0.0, 0.3, 0.2]), torch.tensor([0.0, 0.7, 0.0, 0.0])]
    folded = fold_routers(controlled, gates)
    assert folded.config.num_local_experts == folded.config.num_experts_per_tok == 3
    assert not folded.model.layers[1].mlp.experts.down_proj[1:].any()
    ids = torch.randint(0, 4096, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        replayed = controlled.replay_run(ids, [{COEFFICIENT: g.expand(2, 16, 4)} for g in gates])
        assert torch.allclose(folded(ids).logits, replayed, atol=1e-5, rtol=0)


def test_a_shared_expert_gate_is_folded_into_its_shared_expert():
    """Qwen2-MoE: a router and a shared-expert gate per block; their static values folded, the logits are the
    replay's (the router's static mixture, sigmoid of the gate's constant logit on the shared expert)."""
    controlled = TransformersControlled(zoo.build("qwen2_moe"))
    generator = torch.Generator().manual_seed(0)
    static = [
        torch.tensor([0.6, 0.0, 0.4, 0.0]) if shape == (4,) else torch.randn(shape, generator=generator)
        for shape in controlled.coefficient_slot_shapes
    ]
    assert sorted(set(controlled.coefficient_slot_shapes)) == [(1,), (4,)]
    before = {k: v.clone() for k, v in controlled.model.state_dict().items()}
    folded = fold_routers(controlled, static)
    assert all(torch.equal(v, controlled.model.state_dict()[k]) for k, v in before.items())  # source untouched
    assert folded.config.num_experts == 2 and not folded.model.layers[0].mlp.shared_expert_gate.weight.any()
    ids = torch.randint(0, 4096, (2, 16), generator=generator)
    with torch.no_grad():
        values = [{COEFFICIENT: c.expand(2, 16, *c.shape)} for c in static]
        assert torch.allclose(folded(ids).logits, controlled.replay_run(ids, values), atol=1e-5, rtol=0)


@pytest.fixture
def captures(monkeypatch) -> list[str]:
    """The splits whose windows the export's session reads, and ``capture`` for each capture it starts."""
    seen: list[str] = []
    read, captured = session_module.audit_windows, session_module.capture

    def reading(settings, split, *args, **kwargs):
        seen.append(split)
        return read(settings, split, *args, **kwargs)

    def capturing(*args, **kwargs):
        seen.append("capture")
        return captured(*args, **kwargs)

    monkeypatch.setattr(session_module, "audit_windows", reading)
    monkeypatch.setattr(session_module, "capture", capturing)
    return seen


@pytest.mark.parametrize(
    "name, profile, words",
    [
        ("dense", "layer_mean", "no controller"),
        ("featuregate", "layer_mean_topk", "only for models whose controllers are top-k routers"),
        ("ssm-s0", "layer_mean", "mamba2 model"),
    ],
)
def test_a_refused_export_reads_no_calibration_window_and_captures_nothing(
    name, profile, words, captures, tiny_checkpoints, tmp_path
):
    folder = tiny_checkpoints.get(name) or checkpoints_dir() / name
    with pytest.raises(UserError, match=words):
        export_static(folder, profile, tmp_path / "out")
    assert "capture" not in captures and not (tmp_path / "out").exists()
    if name != "featuregate":  # refused by its family, before any text is read
        assert CALIBRATION not in captures


def test_the_model_card_is_a_hub_card_with_paths_from_its_folder(captures, tiny_checkpoints, texts, tmp_path):
    source = tiny_checkpoints["featuregate"]
    out = export_static(source, "layer_mean", tmp_path / "exports" / "fg", calib=texts["calibration"], max_windows=1)
    assert captures.count("capture") == 1  # the export that is not refused captures its calibration windows
    card = ModelCard.load(out / "README.md")
    assert card.data.library_name == "transformers" and card.data.base_model is None  # a folder: no hub id
    assert {"fca-static-export", "layer_mean", "featuregate"} <= set(card.data.tags)
    facts = json.loads((out / "export_card.json").read_text())
    assert (out / facts["source"]["path"]).resolve() == source.resolve() and facts["source"]["hub"] is None
    assert (out / facts["calibration"]["source"]).resolve() == texts["calibration"].resolve()
    for text in ((out / "README.md").read_text(), (out / "export_card.json").read_text()):
        assert str(tmp_path) not in text and str(source.parent) not in text and str(Path.cwd()) not in text
    assert facts["command"] == (
        f"fca export {os.path.relpath(source, out.parent)} --profile layer_mean "
        f"--calib {os.path.relpath(texts['calibration'], out.parent)} --max-windows 1 --out fg"
    )


def test_an_export_of_a_hub_name_records_its_id_and_commit(offline_cache, tiny_checkpoints, tmp_path, monkeypatch):  # noqa: F811  (the fixture imported above)
    cache_snapshot(offline_cache, "lab/fg", tiny_checkpoints["featuregate"])
    monkeypatch.chdir(tmp_path)  # where no folder lab/fg is: the name is the hub's
    out = export_static("lab/fg", "global_mean", tmp_path / "out", max_windows=1)
    facts = json.loads((out / "export_card.json").read_text())
    assert facts["source"]["hub"] == {"id": "lab/fg", "revision": None, "commit": COMMIT}
    assert (out / facts["source"]["path"]).resolve() == (offline_cache / "models--lab--fg" / "snapshots" / COMMIT)
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == "lab/fg" and COMMIT in card.text
    assert facts["command"].startswith("fca export lab/fg --profile global_mean")
