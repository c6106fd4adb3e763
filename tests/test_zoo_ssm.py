"""The zoo of selective SSMs and gated models: every family the classification gives an SSM or a gate and
no experts (those are ``tests/test_zoo_moe.py``'s), built tiny (``tests/zoo.py``), saved with
``save_pretrained`` and audited by the ``fca audit`` CLI with no controller flags; what a family leaves out
in ``audit.json`` and the report; plus the ``--controllers`` / ``--only-controllers`` flags and their refusals.
"""

import json

import pytest
import torch
import transformers as T
import zoo

from fca_workbench import load_audit
from fca_workbench.adapters import COEFFICIENT, TransformersControlled
from fca_workbench.adapters.classification import CLASSIFIED
from fca_workbench.cli import main

VOCAB = zoo.VOCAB
build = zoo.build_gated
GATED = sorted(
    model_type
    for model_type, entry in CLASSIFIED.items()
    if not entry.untested
    and model_type not in zoo.moe_model_types()
    and any(not kind.startswith("router:") for kind in entry.kinds)
)


def cli_audit(folder, out, *flags: str) -> dict:
    assert main(["audit", str(folder), "--max-windows", "2", "--window", "32", "--out", str(out), *flags]) == 0
    return json.loads((out / "audit.json").read_text())


@pytest.mark.parametrize("model_type", GATED)
def test_every_family_audits_its_selective_controllers_with_no_flags(model_type, tmp_path, tokenizer):
    folder = zoo.save(zoo.build_any(model_type), tmp_path / model_type, tokenizer)
    audit = cli_audit(folder, tmp_path / "audit")
    model = audit["model"]
    assert model["arch"] in (model_type, f"{model_type}_text")  # a wrapper is saved as its text model
    assert tuple(sorted(set(model["controller_kinds"]))) == CLASSIFIED[model_type].kinds
    assert bool(model["left_out"]) == bool(CLASSIFIED[model_type].left_out)
    assert len(model["controller_kinds"]) == len(model["controllers"]) == len(model["slot_labels"])
    conditions = audit["conditions"]
    assert conditions["correct"]["nll"] == conditions["unperturbed"]["nll"]  # bit-exact frozen replay
    per_token = load_audit(tmp_path / "audit").per_token.pivot_table(
        index=["window", "position"], columns="condition", values="nll", observed=True
    )
    assert (per_token["cross_input"] - per_token["correct"]).abs().max() > 0  # reassignment moves the NLL


def test_a_gate_the_adapter_cannot_replay_is_left_out_in_audit_json_and_the_report(tmp_path, tokenizer, capsys):
    """ProphetNet's relative-position projections run on its predict stream's ngram × T states, not one row
    per token: found, not replayable, and said so, never an audit that looks like a model without dynamics."""
    folder = zoo.save(zoo.build_any("prophetnet"), tmp_path / "prophetnet", tokenizer)
    capsys.readouterr()
    audit = cli_audit(folder, tmp_path / "audit")
    report = capsys.readouterr().out
    left_out = audit["model"]["left_out"]
    assert audit["model"]["controllers"] == []
    layers = [f"prophetnet.decoder.layers.{i}.self_attn.relative_pos_embeddings" for i in range(2)]
    assert [line.split(" ")[0] for line in left_out] == layers
    assert all("not one row per token" in line for line in left_out)
    assert "Left out (2, input-dependent but not replayed" in report and f"- {layers[1]}" in report


def test_a_looped_model_audits_every_call_of_its_gates_as_a_controller(tmp_path, tokenizer):
    """``fca audit FOLDER`` on a saved tiny HRM: its two stacks of two layers run in cycles (the low stack
    H_cycles × L_cycles times, the high one H_cycles times), and every call of an attention output gate is a
    controller, ``NAME@callK``, swept at its own index; ``correct`` reproduces the unperturbed run exactly."""
    model = zoo.build_any("hrm_text")
    config = model.config
    folder = zoo.save(model, tmp_path / "hrm", tokenizer)
    audit = cli_audit(folder, tmp_path / "audit", "--per-layer")
    calls = {"L": config.H_cycles * config.L_cycles, "H": config.H_cycles}
    expected = [
        f"model.{stack}_module.layers.{layer}.self_attn.gate_proj@call{call}"
        for stack in ("L", "H")
        for layer in range(config.num_layers_per_stack)
        for call in range(calls[stack])
    ]
    assert audit["model"]["controllers"] == expected and audit["model"]["left_out"] == []
    assert audit["model"]["controller_kinds"] == ["attention_output_gate"] * len(expected)
    conditions = audit["conditions"]
    assert conditions["correct"]["nll"] == conditions["unperturbed"]["nll"]
    assert all(conditions[name]["nll"] != conditions["correct"]["nll"] for name in ("cross_input", "layer_mean"))
    assert len(audit["variation"]["within_std_per_layer"]) == len(expected)  # statistics per call
    assert {row["layer"] for row in audit["per_layer"]} == set(audit["model"]["controller_layers"])
    assert {row["controller"] for row in audit["per_controller"]} == set(expected)  # each call alone, by name
    cross_input = [row["delta"] for row in audit["per_controller"] if row["condition"] == "cross_input"]
    assert len(cross_input) == len(expected) and all(delta != 0 for delta in cross_input)  # each call moves it


@pytest.fixture(scope="module")
def mamba2_folder(tmp_path_factory, tokenizer):
    return zoo.save(build("mamba2"), tmp_path_factory.mktemp("mamba2") / "m", tokenizer)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))


def test_a_fused_projection_keeps_its_content_columns_live_on_replay(ids):
    """Mamba2's in_proj makes (z, x, B, C, Δ): replaying B, C, Δ as zeros leaves z and x as the live
    projection computes them, and the control columns are the values given."""
    controlled = TransformersControlled(build("mamba2"))
    in_proj = controlled.controllers[0]
    kind = controlled.kinds[0]
    (_, start, _), *_, (_, _, stop) = kind.spans
    assert stop == in_proj.out_features and controlled.slot_labels(0)[0] == "B 0"
    assert controlled.slot_labels(0)[-1] == f"dt {controlled.model.config.num_heads - 1}"
    seen = []
    handle = in_proj.register_forward_hook(lambda module, args, output: seen.append(output))
    with torch.no_grad():
        _, values = controlled.capture_run(ids)
        zeros = [{COEFFICIENT: torch.zeros_like(v[COEFFICIENT])} for v in values]
        controlled.replay_run(ids, zeros)
    handle.remove()
    live, replayed = seen  # layer 0's in_proj, capture then replay: the same input in both runs
    assert torch.equal(replayed[..., :start], live[..., :start])
    assert torch.equal(replayed[..., start:], torch.zeros_like(live[..., start:]))
    assert torch.equal(values[0][COEFFICIENT], live[..., start:])


def test_a_model_without_a_context_length_takes_the_window_asked_for(mamba2_folder):
    from fca_workbench.adapters.controlled import load_controlled
    from fca_workbench.adapters.hf import UNBOUNDED_CONTEXT

    controlled = load_controlled(mamba2_folder)
    assert not hasattr(controlled.config, "max_position_embeddings")
    assert controlled.context_length == UNBOUNDED_CONTEXT
    controlled.check_inputs(torch.zeros(1, 4096, dtype=torch.long))  # any window


def test_controllers_adds_to_the_built_in_kinds_and_only_controllers_replaces_them(mamba2_folder, tmp_path, ids):
    named = r"backbone\.layers\.\d+\.mixer\.out_proj"
    audit = cli_audit(mamba2_folder, tmp_path / "added", "--controllers", named)
    assert audit["model"]["controllers"] == [
        "backbone.layers.0.mixer.in_proj",
        "backbone.layers.0.mixer.out_proj",
        "backbone.layers.1.mixer.in_proj",
        "backbone.layers.1.mixer.out_proj",
    ]
    assert audit["model"]["controller_kinds"] == ["selective_ssm", f"tensor:{named}"] * 2
    assert audit["conditions"]["correct"]["nll"] == audit["conditions"]["unperturbed"]["nll"]
    only = cli_audit(mamba2_folder, tmp_path / "only", "--only-controllers", named)
    assert only["model"]["controllers"] == ["backbone.layers.0.mixer.out_proj", "backbone.layers.1.mixer.out_proj"]


def refusal(capsys, folder, *flags: str) -> str:
    code = main(["audit", str(folder), "--max-windows", "2", "--window", "32", "--out", "/nonexistent/x", *flags])
    assert code != 0
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.parametrize(
    "pattern, words",
    [
        ("(", "is not a regular expression"),
        ("(?<=a+)b", "is not a regular expression"),
        ("(a+)+b", "repeats a repeat"),
        (r"(\w|\w\w)*x", "repeats an alternation"),
        (".*.*.*.*x", "4 unbounded repeats"),
        ("lm_head", "outside the decoder layers"),
        (r"backbone\.embeddings", "outside the decoder layers"),
        (r"backbone\.norm_f", "outside the decoder layers"),
        ("nothing_here", "matches no module"),
    ],
)
def test_controllers_regex_refusals_are_one_line(pattern, words, mamba2_folder, capsys):
    for flag in ("--controllers", "--only-controllers"):
        message = refusal(capsys, mamba2_folder, flag, pattern)
        assert words in message and flag in message, message


def test_controllers_and_only_controllers_together_are_refused(mamba2_folder, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", str(mamba2_folder), "--controllers", "a", "--only-controllers", "b"])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_controller_whose_width_follows_the_sequence_length_is_refused_in_one_line():
    """DeepSeek-V3.2's indexer gives each token the top-k of the keys before it: k = min(index_topk, T)."""
    from fca_workbench.foundation.errors import UserError

    config = T.DeepseekV32Config(
        **zoo.COMMON,
        **zoo.ATTENTION | {"num_key_value_heads": 4},
        **zoo.MLA | {"q_lora_rank": 32},
        intermediate_size=64,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        n_shared_experts=1,
        first_k_dense_replace=1,
        index_topk=8,
        index_n_heads=2,
        index_head_dim=16,
    )
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(config).eval()
    with pytest.raises(UserError, match=r"indexer gives \(3,\) per token for 3 tokens and \(4,\) for 4"):
        TransformersControlled(model, controllers=r"model\.layers\.\d+\.self_attn\.indexer")


def test_a_registered_family_whose_modules_the_roles_do_not_know_is_a_one_line_error(monkeypatch):
    """A later transformers whose Mamba2 mixer the roles no longer know must not give an audit with no
    controller (the probe sees its gates, which no role splits, and the classification says it has some)."""
    from fca_workbench.adapters import selective
    from fca_workbench.foundation.errors import UserError

    monkeypatch.setattr(selective, "ROLES", [role for role in selective.ROLES if role is not selective.mamba2_role])
    model = build("mamba2")
    with pytest.raises(UserError, match="no selective_ssm controller found in this mamba2 model"):
        TransformersControlled(model)


def test_fca_audit_on_the_shipped_ssm(tmp_path):
    """``fca audit data/checkpoints/ssm-s0`` on its first 4 windows: a Mamba2 with no context length in its
    config, audited at the default window; the frozen replay of its Δ, B, C reproduces the live NLL, and
    taking selectivity away (a static profile: a time-invariant SSM) costs NLL."""
    from fca_workbench.data.corpus import DATA_DIR

    assert main(["audit", str(DATA_DIR / "checkpoints" / "ssm-s0"), "--max-windows", "4", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "audit.json").read_text())
    assert result["model"]["arch"] == "mamba2" and result["data"]["eval"]["window"] == 256
    assert result["model"]["controllers"] == [f"backbone.layers.{l}.mixer.in_proj" for l in range(4)]
    assert result["model"]["controller_kinds"] == ["selective_ssm"] * 4
    assert result["model"]["slot_labels"][0][:2] == ["B 0", "B 1"] and len(result["model"]["slot_labels"][0]) == 72
    conditions = result["conditions"]
    assert conditions["correct"]["nll"] == conditions["unperturbed"]["nll"]
    assert conditions["cross_input"]["delta"] > 0.01 and conditions["layer_mean"]["delta"] > 0.01
    assert result["execution"]["baseline"] == "same_model"
