"""``fca train``: the loss goes down, and an interrupted run resumes to the same weights.

The same holds for transformers configs (``--hf-config``), whose saved folder reproduces the trained logits.
"""

import csv
import functools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, BertConfig, BertLMHeadModel

import fca_workbench.models  # noqa: F401  (registers the Auto classes)
from fca_workbench.cli import build_parser, main
from fca_workbench.data.corpus import split_path
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.data.windows import load_windows, read_documents
from fca_workbench.foundation.fingerprints import fingerprint_tensor
from fca_workbench.models import next_token_nll
from fca_workbench.training import train as train_module
from fca_workbench.training.hf_config import build_hf_model, read_hf_config
from fca_workbench.training.train import TrainSettings, build_model, finish, train, training_loss


@pytest.fixture(scope="module")
def small_text(tmp_path_factory):
    """A slice of the calibration split, so tests don't tokenize the whole train split."""
    path = tmp_path_factory.mktemp("text") / "small.txt"
    path.write_text(read_documents(split_path("calibration"))[0][:40_000], encoding="utf-8")
    return str(path)


def tiny_settings(arch, small_text, **overrides):
    settings = dict(
        arch=arch,
        train_data=small_text,
        layers=2,
        width=32,
        heads=4,
        window=32,
        steps=40,
        batch_size=8,
        lr=1e-2,
        warmup=5,
        save_every=10,
        eval_windows=4,
    )
    return TrainSettings(**{**settings, **overrides})


def losses(folder):
    with (folder / "train_log.csv").open() as handle:
        return [float(row["loss"]) for row in csv.DictReader(handle)]


@pytest.mark.parametrize("arch", ["dense", "featuregate", "muddpythia"])
def test_short_training_lowers_the_loss_and_saves_a_loadable_checkpoint(arch, small_text, tmp_path):
    card = train(tiny_settings(arch, small_text), tmp_path / "run")
    history = losses(tmp_path / "run")
    assert len(history) == 40
    assert sum(history[-5:]) / 5 < sum(history[:5]) / 5 - 1.0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    assert card["params"] == sum(p.numel() for p in model.parameters())
    assert not (tmp_path / "run" / "trainer_state.pt").exists()
    assert (tmp_path / "run" / "tokenizer.json").is_file()
    assert (arch == "dense") == (card["within_layer_coefficient_std"] is None)


@pytest.mark.parametrize("kind", ["featuregate", "mixtral"])  # a workbench family and a transformers config
def test_interrupted_run_resumes_from_its_step_to_identical_weights(kind, small_text, tmp_path):
    steps = dict(steps=12, save_every=4)
    if kind in TINY_HF_CONFIGS:
        settings = hf_settings(tmp_path, kind, small_text, **steps)
    else:
        settings = tiny_settings(kind, small_text, **steps)
    train(settings, tmp_path / "whole")
    assert train(settings, tmp_path / "split", stop_after=6) is None
    state = torch.load(tmp_path / "split" / "trainer_state.pt", weights_only=True)  # the safe unpickler reads it
    assert state["step"] == 6
    assert len(losses(tmp_path / "split")) == 6
    train(settings, tmp_path / "split")
    assert losses(tmp_path / "split") == losses(tmp_path / "whole")
    whole = load_file(tmp_path / "whole" / "model.safetensors")
    split = load_file(tmp_path / "split" / "model.safetensors")
    assert whole.keys() == split.keys()
    assert all(torch.equal(whole[k], split[k]) for k in whole)


TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32)
TINY_HF_CONFIGS = {
    "mixtral": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    ),
    "olmoe": dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    ),
}


def write_config(folder, **fields):
    path = folder / "config.json"
    path.write_text(json.dumps(fields))
    return path


def hf_settings(folder, model_type, small_text, **overrides):
    fields = read_hf_config(write_config(folder, model_type=model_type, **TINY_HF_CONFIGS[model_type]))
    return tiny_settings(None, small_text, hf_config=fields, **overrides)


@pytest.mark.parametrize("model_type", sorted(TINY_HF_CONFIGS))
def test_hf_config_training_lowers_the_loss_and_saves_the_trained_model(model_type, small_text, tmp_path, monkeypatch):
    probe = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(1))
    trained = {}

    def finish_recording_logits(out, settings, model, tokenizer, log_rows, audit=None):
        model.eval()
        with torch.no_grad():
            trained["logits"] = model(probe).logits
        return finish(out, settings, model, tokenizer, log_rows, audit)

    monkeypatch.setattr(train_module, "finish", finish_recording_logits)
    card = train(hf_settings(tmp_path, model_type, small_text), tmp_path / "run")
    history = losses(tmp_path / "run")
    assert len(history) == 40
    assert sum(history[-5:]) / 5 < sum(history[:5]) / 5 - 1.0
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    assert model.config.model_type == model_type and model.config.vocab_size == 4096
    assert card["params"] == sum(p.numel() for p in model.parameters())
    assert card["within_layer_coefficient_std"] is None
    with torch.no_grad():
        assert torch.equal(model(probe).logits, trained["logits"])
        windows = load_windows(split_path("eval"), load_tokenizer(), 32, 4)
        assert card["eval_nll"] == round(next_token_nll(model(windows).logits, windows).mean().item(), 4)
    assert (card["eval_window_sampling"], card["eval_fingerprint"]) == ("even", fingerprint_tensor(windows))
    assert (tmp_path / "run" / "tokenizer.json").is_file()
    assert not (tmp_path / "run" / "trainer_state.pt").exists()


def test_hf_training_loss_is_the_nll_plus_the_weighted_router_loss_as_transformers_computes_it(tmp_path):
    fields = read_hf_config(
        write_config(tmp_path, model_type="mixtral", router_aux_loss_coef=0.5, **TINY_HF_CONFIGS["mixtral"])
    )
    model = build_hf_model(fields, load_tokenizer(), window=32)
    batch = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(2))
    nll, loss = training_loss(model, batch)
    reference = model(batch, labels=batch, output_router_logits=True)
    assert loss.item() > nll.item() + 0.5  # the load-balancing loss is at least 1 (k experts per token)
    assert torch.allclose(loss, reference.loss, atol=1e-5)
    assert torch.allclose(nll, reference.loss - 0.5 * reference.aux_loss, atol=1e-5)


@pytest.mark.parametrize(
    "content, fragment",
    [
        (None, "no config file"),
        ("{not json", "config.json is not valid JSON"),
        ('["mixtral"]', "needs a JSON object"),
        ('{"model_type": "no-such-model"}', "unknown model_type 'no-such-model'"),
        ('{"model_type": "mixtral", "auto_map": {"AutoConfig": "x.Config"}}', "remote code"),
        ('{"model_type": "mixtral", "hidden_size": "wide"}', "invalid mixtral config"),
        ('{"model_type": "mixtral", "vocab_size": 100}', "smaller than the tokenizer's 4096"),
        ('{"model_type": "mixtral", "max_position_embeddings": 16}', "shorter than the window 32"),
        ('{"model_type": "t5"}', "has no causal language model"),
        ('{"model_type": "mixtral", "attn_implementation": "flash_attention_2"}', "cannot build it: FlashAttention2"),
        ('{"model_type": "mixtral", "attn_implementation": "os.system"}', "not an attention implementation"),
        ('{"model_type": "mixtral", "hidden_act": "os.system"}', "'os.system' is not an activation of transformers"),
        ('{"model_type": "gpt2", "activation_function": ["gelu"]}', "is not an activation of transformers"),
        ('{"model_type": "mixtral", "dtype": "float16"}', "dtype 'float16': fca train trains float32 or bfloat16"),
        ('{"model_type": "mixtral", "torch_dtype": "float64"}', "fca train trains float32 or bfloat16"),
        (json.dumps({"model_type": "bert", **TINY_BERT}), "bert model built from this config is not causal"),
        (json.dumps({"model_type": "roberta", **TINY_BERT}), "cannot run the causal probe's forward"),
    ],
)
def test_bad_hf_config_is_one_line_error(content, fragment, small_text, tmp_path, capsys):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    args = ["train", "--hf-config", path, "--train", small_text, "--window", "32", "--out", tmp_path / "o"]
    status = main([str(a) for a in args])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("fca: error:") and fragment in lines[0], lines
    assert not (tmp_path / "o").exists()


def test_arch_and_hf_config_together_are_refused(tmp_path, capsys):
    path = write_config(tmp_path, model_type="mixtral")
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--arch", "dense", "--hf-config", str(path), "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert main(["train", "--hf-config", str(path), "--layers", "2", "--out", str(tmp_path / "o")]) == 2
    assert "--layers shape --arch models" in capsys.readouterr().err


def test_resuming_with_a_setting_the_saved_run_lacks_names_it(small_text, tmp_path):
    """A state saved before a setting existed must name that setting, not print an empty list."""
    settings = tiny_settings("featuregate", small_text, steps=8, save_every=4)
    assert train(settings, tmp_path / "run", stop_after=4) is None
    path = tmp_path / "run" / "trainer_state.pt"
    state = torch.load(path, weights_only=True)
    del state["settings"]["audit_windows"]
    torch.save(state, path)
    with pytest.raises(train_module.UserError, match=r"different settings \(audit_windows\)"):
        train(settings, tmp_path / "run")


def test_hf_config_beyond_available_memory_is_refused_before_it_is_built(small_text, tmp_path, monkeypatch, capsys):
    """``--hf-config`` is held to the same memory check as ``--arch``: 16 bytes per parameter (fp32 weights,
    gradients and AdamW's two moments) against the memory available, counted without allocating the model."""
    import fca_workbench.models.limits as limits

    fields = read_hf_config(write_config(tmp_path, model_type="mixtral", **TINY_HF_CONFIGS["mixtral"]))
    built = build_hf_model(fields, load_tokenizer(), window=32)
    parameters = sum(p.numel() for p in built.parameters())
    buffers = sum(b.numel() * b.element_size() for b in built.buffers())  # the rotary frequencies

    def available(nbytes):
        monkeypatch.setattr(limits.psutil, "virtual_memory", lambda: type("Memory", (), {"available": nbytes})())

    available(16 * parameters + buffers)  # exactly enough: built
    build_hf_model(fields, load_tokenizer(), window=32)
    available(16 * parameters + buffers - 1)
    with pytest.raises(
        train_module.UserError,
        match=f"imply {parameters:,} parameters and .* GiB of buffers, .* GiB for fp32 weights, gradients and AdamW",
    ):
        build_hf_model(fields, load_tokenizer(), window=32)
    monkeypatch.undo()

    huge = write_config(
        tmp_path,
        model_type="mixtral",
        **{**TINY_HF_CONFIGS["mixtral"], "hidden_size": 65536, "intermediate_size": 262144, "num_attention_heads": 512},
    )
    args = ["train", "--hf-config", huge, "--train", small_text, "--window", "32", "--out", tmp_path / "o"]
    assert main([str(a) for a in args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "GiB for fp32 weights, gradients and AdamW, more than the" in lines[0], lines
    assert not (tmp_path / "o").exists()


SHIPPED = sorted((Path(__file__).resolve().parents[1] / "data" / "checkpoints").iterdir())


@functools.cache
def eval_windows(window: int, count: int) -> torch.Tensor:
    return load_windows(split_path("eval"), load_tokenizer(), window, count)


@pytest.mark.parametrize("folder", SHIPPED, ids=[folder.name for folder in SHIPPED])
def test_a_shipped_model_card_states_the_eval_nll_of_todays_windows(folder):
    """A shipped card's eval NLL is what the checkpoint gives today on the windows its fingerprint names (the
    eval windows a card was computed on moved once, from the split's first 64 to 64 spread over it)."""
    card = json.loads((folder / "model_card.json").read_text())
    windows = eval_windows(card["settings"]["window"], card["eval_windows"])
    assert (card["eval_window_sampling"], card["eval_fingerprint"]) == ("even", fingerprint_tensor(windows))
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        nll = torch.cat([next_token_nll(model(batch).logits, batch) for batch in windows.split(16)]).mean().item()
    assert abs(card["eval_nll"] - nll) <= 6e-5, (card["eval_nll"], nll)
    assert f"spread evenly over the eval split) | {card['eval_nll']} |" in (folder / "README.md").read_text()


def tiny_moe(tmp_path, **settings):
    """A tiny Mixtral built as ``fca train --hf-config`` builds it, with the router-design ``settings``."""
    fields = read_hf_config(write_config(tmp_path, model_type="mixtral", **TINY_HF_CONFIGS["mixtral"]))
    return build_model(TrainSettings(hf_config=fields, window=32, **settings), load_tokenizer())


def router_inputs(model, batch):
    """Each router's input and weight, recorded by forward hooks (which see the input the router computes with)."""
    seen = []
    routers = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
    hooks = [r.register_forward_hook(lambda m, args, out: seen.append((args[0], m.weight))) for r in routers]
    model(batch)
    for hook in hooks:
        hook.remove()
    assert len(seen) == len(routers) == TINY_HF_CONFIGS["mixtral"]["num_hidden_layers"]
    return seen


def test_the_router_z_loss_adds_exactly_its_weight_times_the_mean_squared_logsumexp(tmp_path):
    model = tiny_moe(tmp_path, router_z_loss=0.5)
    batch = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        for router in [m for name, m in model.named_modules() if name.endswith("mlp.gate")]:
            router.weight.mul_(30)  # logits far from 0, so the term is not negligible
        nll, plain = training_loss(model, batch)
        nll_z, with_z = training_loss(model, batch, z_loss_weight=0.5)
        squares = [
            torch.log(torch.exp(h.double() @ w.double().T).sum(-1)).pow(2) for h, w in router_inputs(model, batch)
        ]
    expected = torch.cat(squares).mean().item()
    assert expected > 1.0
    assert torch.equal(nll, nll_z)
    assert (with_z - plain).item() == pytest.approx(0.5 * expected, rel=1e-6)


def test_a_detached_router_input_sends_no_gradient_into_the_hidden_state_and_the_router_still_trains(tmp_path):
    from fca_workbench.training.routing import router_z_loss

    batch = torch.randint(0, 4096, (2, 32), generator=torch.Generator().manual_seed(4))
    gradients = {}
    for router_input in ("normed", "detached"):
        model = tiny_moe(tmp_path, router_input=router_input)
        embeds = model.get_input_embeddings()(batch).detach().requires_grad_()
        out = model(inputs_embeds=embeds, output_router_logits=True)
        router_z_loss(out.router_logits).backward()  # a loss of the router logits alone
        routers = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
        into_hidden = None if embeds.grad is None else embeds.grad.abs().sum().item()
        gradients[router_input] = (into_hidden, [r.weight.grad.abs().sum().item() for r in routers])
    assert gradients["normed"][0] > 0 and gradients["detached"][0] is None  # no path through the hidden state
    assert all(g > 0 for g in gradients["detached"][1])  # the routers' own weights still get their gradient
    # the last router's own gradient is the same either way; an earlier one's differs by what the later routers'
    # loss sends back through the hidden state (the path detaching cuts)
    assert gradients["normed"][1][-1] == pytest.approx(gradients["detached"][1][-1], rel=1e-6)
    assert gradients["normed"][1][0] != gradients["detached"][1][0]


def test_a_detached_router_trains_and_saves_a_plain_transformers_model(small_text, tmp_path):
    settings = hf_settings(tmp_path, "mixtral", small_text, steps=3, save_every=10, router_input="detached")
    model = build_model(settings, load_tokenizer())
    start = {n: p.detach().clone() for n, p in model.named_parameters() if n.endswith("mlp.gate.weight")}
    card = train(settings, tmp_path / "run")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    assert not loaded.model.layers[0].mlp.gate._forward_pre_hooks  # nothing of the detaching is saved
    trained = dict(loaded.named_parameters())
    assert all(not torch.equal(trained[n], w) for n, w in start.items())  # every router moved
    assert card["settings"]["router_input"] == "detached" and card["settings"]["router_z_loss"] == 0.0
    readme = (tmp_path / "run" / "README.md").read_text()
    assert "--router-input detached --out DIR" in readme and "detached from the gradient" in readme


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--arch", "dense", "--router-z-loss", "1e-3"], "--router-z-loss shape the routers of a --hf-config MoE"),
        (["--arch", "featuregate", "--router-input", "detached"], "--router-input shape the routers"),
        (["--hf-config", "LLAMA", "--router-input", "detached"], "this llama model has none"),
        (["--hf-config", "LLAMA", "--router-z-loss", "1e-3"], "this llama model has none"),
        (["--hf-config", "MIXTRAL", "--router-z-loss", "-1"], "--router-z-loss"),
    ],
)
def test_a_router_flag_on_a_model_without_routers_is_one_line(flags, fragment, small_text, tmp_path, capsys):
    llama = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32)
    paths = {
        "LLAMA": write_config(tmp_path, model_type="llama", max_position_embeddings=64, **llama),
        "MIXTRAL": (tmp_path / "m.json"),
    }
    paths["MIXTRAL"].write_text(json.dumps({"model_type": "mixtral", **TINY_HF_CONFIGS["mixtral"]}))
    flags = [str(paths.get(f, f)) for f in flags]
    args = ["train", *flags, "--train", small_text, "--window", "32", "--steps", "2", "--out", str(tmp_path / "o")]
    try:
        status = main(args)
    except SystemExit as exit_info:  # argparse's refusal of a flag's value
        status = exit_info.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and fragment in lines[0], lines
    assert not (tmp_path / "o").exists()


def test_only_a_causal_model_is_trained_whatever_the_mapping_says(tmp_path):
    """``bert`` is in transformers' causal-LM mapping (BertLMHeadModel); only as a decoder does it see no later
    token, and only then is it trained."""
    tokenizer = load_tokenizer()
    with pytest.raises(
        train_module.UserError, match=r"not causal: changing token 15 moves .* \(set is_decoder: true\)"
    ):
        build_hf_model({"model_type": "bert", **TINY_BERT}, tokenizer, window=32)
    decoder = build_hf_model({"model_type": "bert", "is_decoder": True, **TINY_BERT}, tokenizer, window=32)
    assert decoder.training  # the probe leaves the model in the mode it was built in
    decoder.eval()  # no dropout
    probe = torch.randint(0, 4096, (1, 8), generator=torch.Generator().manual_seed(5))
    changed = probe.clone()
    changed[0, -1] += 1
    with torch.no_grad():
        assert torch.equal(decoder(probe).logits[0, :-1], decoder(changed).logits[0, :-1])


def nan_embeddings(monkeypatch):
    """Build every model with NaN input embeddings: its very first loss is NaN."""
    build = train_module.build_model

    def build_poisoned(settings, tokenizer):
        model = build(settings, tokenizer)
        with torch.no_grad():
            model.get_input_embeddings().weight.fill_(float("nan"))
        return model

    monkeypatch.setattr(train_module, "build_model", build_poisoned)


def test_a_run_that_diverges_at_its_first_step_stops_in_one_line_and_writes_nothing(small_text, tmp_path, capsys):
    with pytest.MonkeyPatch.context() as patch:
        nan_embeddings(patch)
        args = ["train", "--arch", "dense", "--layers", "1", "--width", "32", "--window", "32", "--batch-size", "2"]
        status = main([*args, "--steps", "3", "--train", small_text, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("fca")]  # not tqdm's bar
    assert status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "step 1: the training loss is nan; stopped before the update (no checkpoint was saved" in lines[0]
    assert not (tmp_path / "run").exists()


def test_a_resumed_run_that_diverges_keeps_its_last_good_checkpoint(small_text, tmp_path, monkeypatch):
    settings = tiny_settings("dense", small_text, layers=1, steps=8, save_every=4, batch_size=2)
    assert train(settings, tmp_path / "run", stop_after=4) is None
    saved = {name: (tmp_path / "run" / name).read_bytes() for name in ("trainer_state.pt", "train_log.csv")}
    loss_of = train_module.training_loss
    steps = []

    def diverging_at_step_6(model, batch, z_loss_weight=0.0):
        steps.append(len(steps) + 5)
        nll, loss = loss_of(model, batch, z_loss_weight)
        return nll, loss * float("inf") if steps[-1] == 6 else loss

    monkeypatch.setattr(train_module, "training_loss", diverging_at_step_6)
    with pytest.raises(train_module.UserError, match=r"step 6: the training loss is inf; .* keeps its last checkpoint"):
        train(settings, tmp_path / "run")
    assert steps == [5, 6]
    assert {name: (tmp_path / "run" / name).read_bytes() for name in saved} == saved  # the step-4 state, untouched
    assert torch.load(tmp_path / "run" / "trainer_state.pt", weights_only=True)["step"] == 4
    monkeypatch.undo()
    assert train(settings, tmp_path / "run") is not None  # and it resumes from there


def zero_routed_mixtral(folder, small_text, tmp_path):
    """A tiny Mixtral trained 2 steps, saved with every router's weights zero (as ``fca export`` folds a static
    profile: every token takes every expert alike): a checkpoint ``fca train --init`` starts from."""
    settings = hf_settings(tmp_path, "mixtral", small_text, steps=2, save_every=10)
    train(settings, tmp_path / "trained")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "trained")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                parameter.zero_()
    model.save_pretrained(folder)
    load_tokenizer().save_pretrained(folder)
    return model


def test_a_fine_tune_from_init_trains_that_checkpoint_and_frozen_routers_stay_zero(small_text, tmp_path):
    start = zero_routed_mixtral(tmp_path / "export", small_text, tmp_path)
    args = ["train", "--init", str(tmp_path / "export"), "--freeze-routers", "--train", small_text, "--window", "32"]
    args += ["--steps", "3", "--warmup", "2", "--batch-size", "4", "--seed", "1", "--out", str(tmp_path / "tuned")]
    assert main(args) == 0
    tuned = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "tuned").named_parameters())
    initial = dict(start.named_parameters())
    routers = [n for n in initial if n.endswith("mlp.gate.weight")]
    assert len(routers) == 2 and all(not tuned[n].any() for n in routers)
    assert all(not torch.equal(tuned[n], p) for n, p in initial.items() if n not in routers)  # all else trained
    card = json.loads((tmp_path / "tuned" / "model_card.json").read_text())
    assert card["settings"]["init"] == str(tmp_path / "export") and card["settings"]["freeze_routers"]
    assert card["settings"]["hf_config"]["num_local_experts"] == 4 and card["settings"]["warmup"] == 2
    assert [row["lr"] for row in csv.DictReader((tmp_path / "tuned" / "train_log.csv").open())] == [
        f"{0.003 * train_module.lr_factor(step, TrainSettings(arch='dense', steps=3, warmup=2)):.6g}"
        for step in (1, 2, 3)
    ]
    readme = (tmp_path / "tuned" / "README.md").read_text()
    assert f"fca train --init {tmp_path / 'export'} --seed 1 --window 32 --steps 3 --batch-size 4" in readme
    assert "--warmup 2 --freeze-routers --out DIR" in readme and "frozen as they started" in readme


def test_without_frozen_routers_a_fine_tune_trains_the_routers_again(small_text, tmp_path):
    """What ``--freeze-routers`` prevents: a zero router gets a gradient and moves (the export's routing would
    become dynamic again)."""
    zero_routed_mixtral(tmp_path / "export", small_text, tmp_path)
    args = ["train", "--init", str(tmp_path / "export"), "--train", small_text, "--window", "32", "--steps", "2"]
    assert main([*args, "--warmup", "1", "--batch-size", "4", "--out", str(tmp_path / "tuned")]) == 0
    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "tuned")
    assert tuned.model.layers[0].mlp.gate.weight.abs().sum() > 0


INIT_REFUSALS = [
    ("empty", [], "--init: not a checkpoint folder (no config.json)"),
    ("featuregate", [], "is a workbench fca-featuregate model; --init starts from a transformers causal LM"),
    ("bert", [], "a bert model built from this config is not causal"),
    ("mixtral", ["--width", "64"], "--width shape --arch models; a --hf-config file or an --init checkpoint"),
    ("llama", ["--freeze-routers"], "--freeze-routers shape mixture-of-experts routers; this llama model has none"),
    ("no-weights", [], "has no safetensors weights"),
]


def init_folder(kind, folder):
    """A folder ``fca train --init`` must refuse, of each kind ``INIT_REFUSALS`` names."""
    if kind == "featuregate":
        return Path(__file__).resolve().parent.parent / "data" / "checkpoints" / "featuregate-s0"
    folder.mkdir()
    if kind == "bert":  # in transformers' causal-LM mapping, but an encoder unless it is a decoder
        BertLMHeadModel(BertConfig(vocab_size=4096, **TINY_BERT)).save_pretrained(folder)
        load_tokenizer().save_pretrained(folder)
    elif kind != "empty":
        fields = {"model_type": "llama", **TINY_BERT, "max_position_embeddings": 64} if kind == "llama" else None
        fields = fields or {"model_type": "mixtral", **TINY_HF_CONFIGS["mixtral"]}
        build_hf_model(fields, load_tokenizer(), 32).save_pretrained(folder)
        load_tokenizer().save_pretrained(folder)
        if kind == "no-weights":
            (folder / "model.safetensors").unlink()
    return folder


@pytest.mark.parametrize("kind, extra, fragment", INIT_REFUSALS)
def test_an_init_that_is_not_a_trainable_causal_lm_is_one_line(kind, extra, fragment, small_text, tmp_path, capsys):
    folder = init_folder(kind, tmp_path / "init")
    args = ["train", "--init", str(folder), *extra, "--train", small_text, "--window", "32", "--steps", "2"]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0], lines
    assert not (tmp_path / "o").exists()


def test_a_warm_up_that_outlasts_the_run_is_one_warning_and_the_report_never_says_none(small_text, tmp_path, capsys):
    args = ["train", "--arch", "dense", "--layers", "1", "--width", "8", "--heads", "1", "--window", "16"]
    assert main([*args, "--batch-size", "2", "--steps", "3", "--train", small_text, "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if line.startswith("fca: warning:")]
    assert len(warnings) == 1 and "--warmup 50" in warnings[0] and "--steps 3" in warnings[0]
    assert "None" not in out and "no controller coefficients (dense has no controller)" in out


def test_a_warm_up_shorter_than_the_run_says_nothing():
    assert TrainSettings(arch="dense", steps=51, warmup=50).warmup_warning() is None
    assert TrainSettings(arch="dense", steps=50, warmup=50).warmup_warning() is not None


def test_every_train_option_shows_its_default_in_help():
    train_parser = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    chosen = {"help", "arch", "hf_config", "init", "out"}  # the model is chosen, the folder named: no default
    options = [action for action in train_parser._actions if action.dest not in chosen]
    assert options and [a.dest for a in options if "default" not in (a.help or "")] == []
