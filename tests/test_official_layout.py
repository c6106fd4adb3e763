"""MUDDPythia checkpoints in the official Hugging Face layout: strict loading, ``auto_map`` never followed,
configs checked, tokenizer from the folder, and ``fca audit`` on such a folder.

Every folder here is written by ``save_official`` from a tiny random MUDDPythia (3 layers, dim 64) whose
parameters are all perturbed, so controllers, norms and biases are away from their init. Each folder also
holds booby-trapped ``configuration_muddpythia.py`` / ``modeling_muddpythia.py`` (the files the official
``auto_map`` names): importing either writes a marker file and raises.
"""

import csv
import gzip
import json
import os
import sys

import pytest
import torch
from conftest import assert_identical_models, fca, perturbed_muddpythia
from safetensors.torch import load_file, save_file

from fca_workbench.audit.budget import audit_batch_size, window_bytes
from fca_workbench.audit.capture import capture
from fca_workbench.audit.replay import replay_nll
from fca_workbench.data.tokenizer import load_tokenizer
from fca_workbench.foundation.errors import UserError
from fca_workbench.models import load_model
from fca_workbench.models.loading import OFFICIAL_1P4B_CONFIG, OFFICIAL_AUTO_MAP, read_config
from fca_workbench.models.muddpythia import MUDDPythiaConfig, MUDDPythiaForCausalLM
from fca_workbench.models.official_layout import save_official

TINY = dict(
    vocab_size=512, block_size=64, n_layer=3, n_head=4, dim=64, use_qk_norm=True, expand_last=True, round64=True
)
FORMATS = [("safetensors", 1), ("safetensors", 3), ("bin", 1), ("bin", 2)]
CODE_FILES = ("configuration_muddpythia.py", "modeling_muddpythia.py")


def tiny_official_model(seed=0, **overrides) -> MUDDPythiaForCausalLM:
    return perturbed_muddpythia({**TINY, **overrides}, seed)


def write_official(model, folder, weights="safetensors", shards=1, tokenizer=None):
    """The official layout plus trap files for the code its ``auto_map`` names; returns the marker path."""
    save_official(model, folder, weights=weights, shards=shards, tokenizer=tokenizer)
    marker = folder / "IMPORTED"
    for name in CODE_FILES:
        (folder / name).write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\nraise RuntimeError('auto_map code imported: {name}')\n"
        )
    return marker


def assert_code_never_imported(marker):
    """No marker written, and no module in this process came from the checkpoint folder or the dynamic
    module cache transformers uses for ``trust_remote_code``."""
    assert not marker.exists(), marker.read_text()
    folder = str(marker.parent.resolve())
    loaded = [
        name
        for name, module in list(sys.modules.items())
        if name.startswith("transformers_modules") or str(getattr(module, "__file__", None) or "").startswith(folder)
    ]
    assert loaded == [], loaded


def tokens(vocab=TINY["vocab_size"], batch=2, length=24, seed=1):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


# ------------------------------------------------------------------------------------------------------
# strict round trips


@pytest.mark.parametrize("weights, shards", FORMATS)
def test_official_folder_loads_strictly_and_round_trips_bit_exactly(tmp_path, weights, shards):
    model = tiny_official_model()
    marker = write_official(model, tmp_path, weights, shards)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"] == OFFICIAL_AUTO_MAP and config["model_type"] == "muddpythia"
    assert set(config) == set(OFFICIAL_1P4B_CONFIG)  # exactly the official fields
    if shards > 1:
        index = tmp_path / (
            "model.safetensors.index.json" if weights == "safetensors" else "pytorch_model.bin.index.json"
        )
        assert len(set(json.loads(index.read_text())["weight_map"].values())) == shards

    loaded = load_model(tmp_path)

    assert type(loaded) is MUDDPythiaForCausalLM and not loaded.training
    assert not hasattr(loaded.config, "auto_map")
    assert_identical_models(model, loaded, tokens())
    assert_code_never_imported(marker)


def test_bf16_official_checkpoint_loads_in_fp32_and_bf16(tmp_path):
    """The releases ship bf16 weights (``torch_dtype: bfloat16``): fp32 on CPU upcasts exactly."""
    model = tiny_official_model().to(torch.bfloat16)
    write_official(model, tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["torch_dtype"] == "bfloat16"
    as_fp32 = load_model(tmp_path)
    as_bf16 = load_model(tmp_path, torch.bfloat16)
    assert next(as_fp32.parameters()).dtype == torch.float32
    assert next(as_bf16.parameters()).dtype == torch.bfloat16
    for name, tensor in model.state_dict().items():
        assert torch.equal(as_bf16.state_dict()[name], tensor)
        assert torch.equal(as_fp32.state_dict()[name], tensor.float())


def test_auto_map_code_is_never_imported_even_when_it_would_run(tmp_path, monkeypatch):
    """The folder is on sys.path and the config points at its code: loading still builds our class."""
    marker = write_official(tiny_official_model(), tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # `import modeling_muddpythia` would now find the trap
    with pytest.raises(RuntimeError, match="auto_map code imported"):  # the trap works when imported
        import importlib

        importlib.import_module("modeling_muddpythia")
    marker.unlink()
    sys.modules.pop("modeling_muddpythia", None)

    model = load_model(tmp_path)

    assert type(model) is MUDDPythiaForCausalLM
    assert_code_never_imported(marker)


# ------------------------------------------------------------------------------------------------------
# strictness: every key accounted for, by name


def rewrite_safetensors(folder, change):
    path = folder / "model.safetensors"
    state = dict(load_file(path))
    change(state)
    save_file(state, path, metadata={"format": "pt"})


def test_unexpected_key_is_refused_by_name(tmp_path):
    write_official(tiny_official_model(), tmp_path)
    rewrite_safetensors(tmp_path, lambda s: s.update({"layers.1.attention.extra_proj.weight": torch.zeros(3, 3)}))
    with pytest.raises(UserError) as info:
        load_model(tmp_path)
    message = one_line(info)
    assert "1 unexpected key(s): layers.1.attention.extra_proj.weight" in message
    assert "missing" not in message


def test_missing_keys_are_refused_by_name(tmp_path):
    write_official(tiny_official_model(), tmp_path)
    rewrite_safetensors(
        tmp_path, lambda s: [s.pop("dynamic_dense.1.w2.weight"), s.pop("layers.2.attention.q_norm.weight")]
    )
    with pytest.raises(UserError) as info:
        load_model(tmp_path)
    message = one_line(info)
    assert "2 missing key(s)" in message
    assert "dynamic_dense.1.w2.weight" in message and "layers.2.attention.q_norm.weight" in message


def test_wrong_shape_is_refused_by_name(tmp_path):
    write_official(tiny_official_model(), tmp_path)
    rewrite_safetensors(tmp_path, lambda s: s.update({"dense_bs.0": torch.zeros(4, 3)}))
    with pytest.raises(UserError) as info:
        load_model(tmp_path)
    assert "dense_bs.0 [4, 3] in checkpoint vs [4, 2] in model" in one_line(info)


def test_many_bad_keys_are_summarised_on_one_line(tmp_path):
    write_official(tiny_official_model(), tmp_path)
    rewrite_safetensors(tmp_path, lambda s: s.update({f"junk.{i}": torch.zeros(1) for i in range(9)}))
    with pytest.raises(UserError) as info:
        load_model(tmp_path)
    message = one_line(info)
    assert "9 unexpected key(s): junk.0" in message and "(4 more)" in message


@pytest.mark.parametrize("weights, shards", [("bin", 1), ("safetensors", 2), ("bin", 2)])
def test_strictness_holds_for_bin_and_sharded_weights(tmp_path, weights, shards):
    model = tiny_official_model()
    state = model.state_dict()
    state["rogue.weight"] = torch.zeros(2)
    del state["norm.bias"]

    class Holder(torch.nn.Module):  # save_official writes whatever state dict the module has
        config = model.config

        def state_dict(self, *args, **kwargs):
            return state

    write_official(Holder(), tmp_path, weights, shards)
    with pytest.raises(UserError) as info:
        load_model(tmp_path)
    message = one_line(info)
    assert "missing key(s): norm.bias" in message and "unexpected key(s): rogue.weight" in message


def test_sharded_index_that_disagrees_with_its_shards_is_refused(tmp_path):
    write_official(tiny_official_model(), tmp_path, shards=2)
    index_path = tmp_path / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["phantom.weight"] = "model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(UserError, match="not in their shard: phantom.weight"):
        load_model(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UserError, match="names shard model-00002-of-00002.safetensors, which is missing"):
        load_model(tmp_path)


def test_reference_decode_caches_are_the_only_tolerated_extras(tmp_path):
    """``setup_caches`` in the reference registers zero-filled kv/layer cache buffers; they are not weights."""
    model = tiny_official_model()
    write_official(model, tmp_path)
    caches = {
        "layers.0.attention.kv_cache.k_cache": torch.zeros(1, 4, 8, 16),
        "layers.0.attention.kv_cache.v_cache": torch.zeros(1, 4, 8, 16),
        "layer_cache.layer_cache": torch.zeros(4, 1, 1, 64),
    }
    rewrite_safetensors(tmp_path, lambda s: s.update(caches))
    loaded = load_model(tmp_path)
    assert loaded.state_dict().keys() == model.state_dict().keys()
    rewrite_safetensors(tmp_path, lambda s: s.update({"layers.0.attention.kv_cache.other": torch.zeros(1)}))
    with pytest.raises(UserError, match="unexpected key.*kv_cache.other"):
        load_model(tmp_path)


def test_folder_without_weights_is_refused(tmp_path):
    write_official(tiny_official_model(), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(UserError, match="no model.safetensors, model.safetensors.index.json, pytorch_model.bin"):
        load_model(tmp_path)


def test_bin_that_is_not_a_plain_state_dict_is_refused_without_unpickling_code(tmp_path):
    """``.bin`` goes through ``torch.load(weights_only=True)``: a pickle carrying code is refused, not run."""
    write_official(tiny_official_model(), tmp_path, weights="bin")
    marker = tmp_path / "PICKLE_RAN"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"norm.weight": Payload()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(UserError, match="corrupt or missing weights"):
        load_model(tmp_path)
    assert not marker.exists()


@pytest.mark.skipif(
    not os.environ.get("MUDDPYTHIA_REFERENCE"),
    reason="set MUDDPYTHIA_REFERENCE to a copy of the reference's pytorch/muddpythia folder",
)
def test_the_reference_code_reads_our_official_folder_and_we_read_its_state_dict(tmp_path):
    """Opt-in, both directions in bf16: the reference model loads the folder ``save_official`` wrote
    (its own config class on our config.json, our shards with ``strict=True``) and gives the logits
    ``load_model`` gives, bit for bit; and the reference's state dict after ``setup_caches`` (weights plus
    its decode-cache buffers) saved as ``model.safetensors`` loads strictly through ``load_model``."""
    from test_muddpythia import _load_reference

    RefConfig, RefModel = _load_reference(os.environ["MUDDPYTHIA_REFERENCE"])
    ours = tiny_official_model().to(torch.bfloat16)
    write_official(ours, tmp_path / "ours", shards=2)
    raw = json.loads((tmp_path / "ours" / "config.json").read_text())
    reference = RefModel(RefConfig(**raw)).eval()
    state = {}
    for shard in sorted((tmp_path / "ours").glob("model-*.safetensors")):
        state.update(load_file(shard))
    reference.load_state_dict(state, strict=True)
    reference.to(torch.bfloat16).setup_caches(max_batch_size=2, max_seq_length=TINY["block_size"], dtype=torch.bfloat16)
    loaded = load_model(tmp_path / "ours", torch.bfloat16)
    ids = tokens(length=20)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, reference(ids, return_tensor=True))

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "config.json").write_text(json.dumps(raw))
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, theirs / "model.safetensors")
    assert any("kv_cache" in k for k in reference.state_dict())
    from_reference = load_model(theirs, torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(from_reference(ids).logits, loaded(ids).logits)


# ------------------------------------------------------------------------------------------------------
# configs


def official_config_folder(tmp_path, **changes):
    config = {**OFFICIAL_1P4B_CONFIG, **changes}
    config = {k: v for k, v in config.items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def families():
    from fca_workbench.models import FAMILIES

    return FAMILIES


def test_the_verbatim_official_1p4b_config_is_read_without_its_auto_map(tmp_path):
    from test_muddpythia import OFFICIAL_1P4B  # the reference's config_1p4b.json, verbatim

    assert OFFICIAL_1P4B_CONFIG == OFFICIAL_1P4B
    config = read_config(official_config_folder(tmp_path), families())
    assert type(config) is MUDDPythiaConfig
    assert (config.n_layer, config.dim, config.n_head, config.head_dim, config.vocab_size) == (24, 2048, 16, 128, 50432)
    assert (config.intermediate_size, config.block_size, config.rotary_pct) == (8192, 2048, 0.25)
    assert config.use_qk_norm and config.expand_last and config.round64 and config.use_parallel_residual
    assert not hasattr(config, "auto_map") and "auto_map" not in config.to_dict()


@pytest.mark.parametrize(
    "changes, words",
    [
        (dict(dense_type="l"), "dense_type='l'"),
        (dict(dense=False), "dense=False"),
        (dict(n_layer=None, dim=None), "is not a MUDDPythia config: missing n_layer, dim"),
        (dict(dense_type=None), "missing dense_type"),
        (dict(n_layer="24"), "wrong type n_layer='24' (expected int)"),
        (dict(use_qk_norm=1), "use_qk_norm=1 (expected bool)"),
        (dict(n_local_heads=8), "n_local_heads"),
        (dict(model_type="muddformer"), "holds a 'muddformer' model, not one of"),
        (dict(model_type=None), "holds no model_type"),
    ],
)
def test_config_that_is_not_muddpythia_shaped_is_refused_clearly(tmp_path, changes, words):
    with pytest.raises(UserError) as info:
        read_config(official_config_folder(tmp_path, **changes), families())
    assert words in one_line(info)


def test_refused_config_never_reaches_the_weights(tmp_path):
    write_official(tiny_official_model(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["dense_type"] = "kv"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="not a MUDDPythia config this workbench can build: dense_type='kv'"):
        load_model(tmp_path)


# ------------------------------------------------------------------------------------------------------
# tokenizer and batch size


@pytest.mark.parametrize("tokenizer_class", ["GPTNeoXTokenizer", "GPTNeoXTokenizerFast"])
def test_gpt_neox_style_tokenizer_files_load_from_the_folder(tmp_path, tokenizer_class):
    """The releases ship GPT-NeoX tokenizer files (tokenizer.json + a tokenizer_config naming the class)."""
    shipped = load_tokenizer()
    shipped.save_pretrained(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = tokenizer_class
    config_path.write_text(json.dumps(config))
    loaded = load_tokenizer(tmp_path)
    text = "To be, or not to be, that is the question."
    assert loaded(text)["input_ids"] == shipped(text)["input_ids"]


def test_batch_size_is_16_on_cpu_and_a_cache_keeps_its_shard_size(tmp_path):
    model = tiny_official_model()
    assert audit_batch_size(model, 64, "cpu") == 16
    assert audit_batch_size(model, 64, "cpu", tmp_path / "no-cache") == 16
    (tmp_path / "manifest.json").write_text(json.dumps({"shard_size": 5}))
    assert audit_batch_size(model, 64, "cpu", tmp_path) == 5


def test_cuda_batch_size_follows_free_memory_and_the_model_size(monkeypatch):
    """The CUDA branch with ``mem_get_info`` stubbed (no GPU needed): a 1.4B-sized bf16 model whose weights
    are not on the GPU yet, 2048-token windows. Expected sizes are worked out here from the documented rule:
    free memory less the weights and a 2 GiB reserve, over 1.5 × the per-window estimate, between 1 and 64."""
    with torch.device("meta"):
        big = MUDDPythiaForCausalLM(
            MUDDPythiaConfig(**{k: v for k, v in OFFICIAL_1P4B_CONFIG.items() if k != "auto_map"})
        )
    big = big.to(torch.bfloat16)
    weights = 2 * sum(p.numel() for p in big.parameters())  # bf16: 2 bytes a parameter
    # window_bytes' docstring for the official config (24 layers, width 2048, 16 heads, vocab 50432), T = 2048, bf16
    T, width, layers, heads, vocab, e = 2048, 2048, 24, 16, 50432, 2
    kept_outputs, temporaries, ffn = (layers + 1) * T * width * e, 8 * T * width * e, 2 * T * 6 * width * e
    per_window = kept_outputs + temporaries + ffn + 4 * heads * T * T * e + T * vocab * (e + 12)
    assert window_bytes(big, 2048) == per_window
    needed = 1.5 * per_window
    reserve = 2 * 2**30
    cases = []
    for k in (2, 7, 23, 64):  # exactly k windows fit; one byte less and only k - 1 do
        exactly = weights + reserve + int(needed * k)
        cases += [(exactly, k), (exactly - 1, k - 1)]
    cases += [(weights + reserve + int(needed * 65), 64), (10**15, 64), (4 * 2**30, 1), (weights + reserve, 1)]
    h200 = 136 * 2**30
    cases.append((h200, (h200 - weights - reserve) // needed))
    for free, expected in cases:
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None, free=free: (free, 141 * 2**30))
        assert audit_batch_size(big, 2048, "cuda") == expected, (free, expected)
    assert 20 <= cases[-1][1] <= 64


def test_window_bytes_grows_with_the_window_and_counts_the_logits():
    with torch.device("meta"):
        big = MUDDPythiaForCausalLM(
            MUDDPythiaConfig(**{k: v for k, v in OFFICIAL_1P4B_CONFIG.items() if k != "auto_map"})
        )
    per_window = window_bytes(big, 2048)
    assert 2048 * 50432 * 4 * 3 < per_window < 8 * 2**30  # at least the fp32 logits work, well under 8 GiB
    assert window_bytes(big, 1024) < per_window


# ------------------------------------------------------------------------------------------------------
# the audit on an official-layout folder


@pytest.fixture(scope="module")
def audit_folder(tmp_path_factory):
    """An official-layout folder with the shipped tokenizer (vocab 4096) and context 64."""
    folder = tmp_path_factory.mktemp("official")
    model = tiny_official_model(vocab_size=4096)
    marker = write_official(model, folder, tokenizer=load_tokenizer())
    return folder, model, marker


@pytest.mark.timeout(600)  # `fca audit` in a subprocess: a hang fails here
def test_fca_audit_runs_on_an_official_layout_folder(audit_folder, tmp_path):
    folder, _, marker = audit_folder
    out = tmp_path / "out"
    result = fca("audit", folder, "--window", 64, "--max-windows", 8, "--batch-size", 4, "--out", out)
    assert result.returncode == 0, result.stderr[-2000:]
    audit = json.loads((out / "audit.json").read_text())
    assert audit["model"]["arch"] == "muddpythia"
    assert audit["data"]["eval"]["windows"] == 8 and audit["data"]["eval"]["window"] == 64
    conditions = audit["conditions"]
    assert {"unperturbed", "correct", "cross_input", "token_shuffle"} <= set(conditions)
    assert conditions["correct"]["nll"] == conditions["unperturbed"]["nll"]
    with gzip.open(out / "per_token_nll.csv.gz", "rt") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 8 * 63
    assert all(r["correct"] == r["unperturbed"] for r in rows)
    assert conditions["cross_input"]["nll"] != conditions["correct"]["nll"]
    assert "cross_input" in result.stdout
    assert_code_never_imported(marker)


def test_capture_and_replay_on_the_loaded_official_model(audit_folder, tmp_path):
    folder, original, _ = audit_folder
    model = load_model(folder)
    windows = tokens(vocab=4096, batch=6, length=64, seed=3)
    cache = capture(model, windows, tmp_path / "cache", batch_size=4)
    assert cache.manifest["slot_shapes"] == [[4, 2], [4, 3], [1, 4]]  # [C, i+2]; one stream after the last layer
    first = cache.coefficients(torch.arange(2))
    assert [tuple(c.shape) for c in first] == [(2, 64, 4, 2), (2, 64, 4, 3), (2, 64, 1, 4)]
    with torch.no_grad():
        live = original(windows[:2], return_coefficients=True).coefficients
    assert all(torch.equal(c, l) for c, l in zip(first, live))

    calls = []
    handles = [m.register_forward_hook(lambda *_: calls.append(1)) for m in model.controllers]
    with torch.no_grad():  # neither the controller's output nor the static add may reach a replay
        for bias in model.dense_bs:
            bias.fill_(float("nan"))
    correct = replay_nll(model, windows, cache, "correct")
    shuffled = replay_nll(model, windows, cache, "token_shuffle")
    crossed = replay_nll(model, windows, cache, "cross_input")
    for handle in handles:
        handle.remove()
    assert calls == []
    assert torch.equal(correct, replay_nll(model, windows, cache, "unperturbed"))
    assert torch.isfinite(shuffled).all() and not torch.equal(shuffled, correct)
    assert torch.isfinite(crossed).all() and not torch.equal(crossed, correct)


@pytest.mark.timeout(300)
def test_fca_audit_without_tokenizer_files_fails_on_one_line(tmp_path):
    folder = tmp_path / "no-tokenizer"
    write_official(tiny_official_model(vocab_size=4096), folder)
    result = fca("audit", folder, "--window", 64, "--max-windows", 8, "--batch-size", 4, "--out", tmp_path / "out")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [f"fca: error: no tokenizer files in {folder}"]
    assert not (tmp_path / "out" / "audit.json").exists()
