"""``fca audit FOLDER``, end to end in one process, on a tiny seeded model of every mixture-of-experts family of
transformers' causal-LM mapping (``tests/zoo.py``), and the coverage of that mapping by the family registry.

Per family: routers found (one per block that holds experts), ``correct`` == ``unperturbed`` bit for bit,
expert fraction executed k/E (less the zero-computation experts' share), and a reassignment moves the NLL.
"""

import json
import re

import pytest
import torch
import zoo

from fca_workbench import load_audit
from fca_workbench.adapters.families import MOE_FAMILIES
from fca_workbench.cli import main

ARGS = ["--max-windows", "2", "--window", "32", "--resamples", "50", "--latency-repeats", "1", "--batch-size", "2"]
TEXT_CHARS = 4000  # of each shipped split: enough for 2 windows of 32 tokens, tokenized in milliseconds
# a multimodal model type audited through its text model type: its vision tower's default per-layer settings
# name layers a one-layer tiny tower lacks
COVERED_BY = {"dots3_note": "dots3_note_text"}
AUDITED = sorted(set(zoo.moe_model_types()) - set(COVERED_BY))


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> list[str]:
    """``--eval`` and ``--calib`` files: the start of the shipped splits (tokenizing whole splits would
    cost more than auditing a tiny model)."""
    from fca_workbench.data.corpus import split_path
    from fca_workbench.data.windows import read_documents

    folder = tmp_path_factory.mktemp("texts")
    args = []
    for option, split in (("--eval", "eval"), ("--calib", "calibration")):
        path = folder / f"{split}.txt"
        path.write_text(read_documents(split_path(split))[0][:TEXT_CHARS], encoding="utf-8")
        args += [option, str(path)]
    return args


def expert_blocks(model: torch.nn.Module) -> int:
    """Blocks that hold experts, counted independently of the adapter: the parents of ``*Experts`` modules,
    and ``*MoE`` modules that hold their experts as embeddings (Doge's product keys)."""
    blocks = set()
    for name, module in model.named_modules():
        if type(module).__name__.endswith("Experts"):
            blocks.add(name.rpartition(".")[0])
        elif type(module).__name__.endswith("MoE") and not any(
            type(m).__name__.endswith("Experts") for m in module.modules()
        ):
            blocks.add(name)
    return len(blocks)


@pytest.mark.parametrize("model_type", AUDITED)
def test_fca_audit_on_every_moe_family(model_type, tmp_path, tokenizer, texts, capsys):
    model = zoo.build(model_type)
    folder = zoo.save(model, tmp_path / model_type, tokenizer)
    assert main(["audit", str(folder), *ARGS, *texts, "--out", str(tmp_path / "audit")]) == 0
    capsys.readouterr()
    result = json.loads((tmp_path / "audit" / "audit.json").read_text())
    experts = result["execution"]["experts"]
    assert len(experts["controllers"]) == expert_blocks(model) > 0
    assert experts["implementation"] == model.get_experts_implementation()[""]  # the model's own kernel
    conditions = result["conditions"]
    assert conditions["correct"]["nll"] == conditions["unperturbed"]["nll"]

    top_k = zoo.routed_k(model_type)
    for count, fraction, zero in zip(experts["experts"], experts["fraction_executed"], experts["zero_computation"]):
        assert count == zoo.routed_experts(model_type)
        assert fraction == pytest.approx(top_k / count * (1 - zero), rel=1e-12, abs=0)
    per_token = load_audit(tmp_path / "audit").per_token.pivot_table(
        index=["window", "position"], columns="condition", values="nll", observed=True
    )
    assert (per_token["cross_input"] - per_token["correct"]).abs().max() > 1e-4


def test_every_moe_family_of_the_mapping_is_in_the_registry():
    """A MoE family transformers adds later fails here until the registry (and so the zoo) knows it."""
    assert sorted(set(zoo.moe_model_types()) - set(MOE_FAMILIES)) == []
    assert all(COVERED_BY[t] in AUDITED for t in COVERED_BY)


def test_the_family_table_in_the_docs_is_the_registrys():
    from fca_workbench.adapters.families import moe_table

    text = (zoo.ROOT / "docs" / "guides" / "foreign-models.md").read_text(encoding="utf-8")
    committed = re.search(r"<!-- families -->\n(.*?)<!-- /families -->", text, re.S)
    assert committed is not None and committed.group(1) == moe_table()
