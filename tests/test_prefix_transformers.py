"""Prefix reuse for transformers models: a replay from decoder layer l starts from the recorded outputs of the
layers before it (replaced on the instance, never run) and equals the full frozen forward; the per-layer
sweep's rows equal those of full forwards. For moe-s0 (the shipped Mixtral), a Mamba2 and a Qwen2-MoE (two
controllers per layer: the router and the shared-expert gate)."""

import contextlib

import pytest
import torch
import transformers as T
import zoo
from zoo import COMMON
from zoo import GATED as ZOO

from fca_workbench.adapters import COEFFICIENT, SteppingModel, TransformersControlled
from fca_workbench.adapters.controlled import load_controlled
from fca_workbench.adapters.selective import ColumnKind
from fca_workbench.adapters.sites import sites
from fca_workbench.audit.assignment import calibration_profiles
from fca_workbench.audit.budget import conditions_per_pass, window_bytes
from fca_workbench.audit.capture import capture
from fca_workbench.audit.interventions import restrict_to
from fca_workbench.audit.prefix import PrefixCache
from fca_workbench.audit.sweep import PREFIX, full_forward_window_nll, prefix_window_nll, sweep_mode
from fca_workbench.foundation.errors import UserError
from fca_workbench.foundation.resources import checkpoints_dir
from fca_workbench.models import next_token_nll

SWEPT = ["cross_input", "layer_mean", "token_shuffle"]  # a router's whole output moved, a static mixture


def moe_s0():
    return load_controlled(checkpoints_dir() / "moe-s0")


def mamba2():
    config_class, fields = ZOO["mamba2"]
    torch.manual_seed(0)
    return TransformersControlled(T.Mamba2ForCausalLM(config_class(**COMMON, **fields)).eval())


def qwen2_moe():
    return TransformersControlled(zoo.build("qwen2_moe"))


MODELS = {"moe-s0": moe_s0, "mamba2": mamba2, "qwen2_moe": qwen2_moe}


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    return MODELS[request.param]()


def random_windows(count, length, seed):
    return torch.randint(1, 4096, (count, length), generator=torch.Generator().manual_seed(seed))


def shifted(values):
    """Every controller's whole output moved one position along the window: a real change of assignment."""
    return [{name: t.roll(1, dims=1) for name, t in value.items()} for value in values]


@contextlib.contextmanager
def counting(modules):
    """How often each module's own forward runs (an instance attribute wrapping it: a module replaced on the
    instance by its recorded output shadows the wrapper, so it is not counted; a hook would be)."""
    calls = [0] * len(modules)

    def counted(index, forward):
        def run(*args, **kwargs):
            calls[index] += 1
            return forward(*args, **kwargs)

        return run

    for index, module in enumerate(modules):
        module.forward = counted(index, module.forward)
    try:
        yield calls
    finally:
        for module in modules:
            del module.forward


def test_a_transformers_model_steps_by_layer(model):
    assert isinstance(model, SteppingModel) and sweep_mode(model) == PREFIX
    assert model.blocks[0] is model.blocks[0] and len(model.blocks) == model.config.num_hidden_layers
    resumed = [model.resume_layer(i) for i in range(len(model.controllers))]
    assert resumed == sorted(resumed) and resumed[-1] == len(model.blocks) - 1
    for name, layer in zip(model.controller_names, resumed):
        assert f"layers.{layer}." in name


def test_replay_from_the_prefix_equals_the_full_frozen_forward(model):
    window = random_windows(2, 24, seed=3)
    with torch.no_grad():
        logits, own = model.capture_run(window)
    prefix = PrefixCache(model, window, coefficients=own)
    assert torch.equal(prefix.nll, next_token_nll(logits, window))  # the frozen pass replays the live one
    assert len(prefix.states) == len(model.blocks) + 1 and prefix.num_controllers == len(model.controllers)
    changed = []
    with counting(model.blocks) as calls, counting(model.controllers) as controller_calls:
        for layer in range(prefix.num_controllers):
            values = restrict_to(shifted(own), own, [layer])
            with torch.no_grad():
                full = next_token_nll(model.replay_run(window, values), window)
            calls[:] = [0] * len(calls)
            got = prefix.replay_nll(values, [layer])
            assert calls == [int(b >= model.resume_layer(layer)) for b in range(len(model.blocks))], layer
            assert torch.allclose(got, full, rtol=0, atol=model.replay_tolerance), layer
            assert torch.equal(got, full), layer  # the same ops on the same tensors
            changed.append(not torch.equal(got, prefix.nll))
            assert torch.equal(prefix.logits(values, [layer]), model.replay_run(window, values))
    assert sum(changed) >= len(changed) - 1  # the interventions really change something
    # no controller ran in any replay (a fused projection's runs: its control columns are overwritten)
    assert all(calls == 0 for calls, kind in zip(controller_calls, model.kinds) if not isinstance(kind, ColumnKind))


def test_batched_variants_equal_one_at_a_time(model):
    window = random_windows(2, 16, seed=4)
    prefix = PrefixCache(model, window, coefficients=model.capture_run(window)[1])
    layer = prefix.num_controllers - 1
    mean = [{COEFFICIENT: v[COEFFICIENT].mean(dim=(0, 1)).expand_as(v[COEFFICIENT])} for v in prefix.values]
    variants = [restrict_to(v, prefix.values, [layer]) for v in (shifted(prefix.values), mean, prefix.values)]
    many = prefix.replay_nll_many(variants, [layer])  # a static mixture among whole router outputs
    assert many.shape == (3, *prefix.nll.shape)
    for got, values in zip(many, variants):
        assert torch.allclose(got, prefix.replay_nll(values, [layer]), rtol=0, atol=1e-5)
    assert torch.allclose(many[2], prefix.nll, rtol=0, atol=1e-5)
    assert not torch.allclose(many[1], prefix.nll, rtol=0, atol=1e-3)


def test_sweep_rows_equal_the_full_forward_sweep(model, tmp_path):
    windows = random_windows(5, 16, seed=1)
    cache = capture(model, windows, tmp_path / "eval", batch_size=3)
    calibration = random_windows(4, 16, seed=2)
    profiles = calibration_profiles(capture(model, calibration, tmp_path / "calib", batch_size=4), calibration)
    with counting(model.blocks) as calls:  # two conditions per pass: a router's whole output beside a profile
        prefix_nll, prefix_correct = prefix_window_nll(model, windows, cache, SWEPT, profiles, 0, "cpu", group=2)
    full_nll, full_correct = full_forward_window_nll(model, windows, cache, SWEPT, profiles, 0, "cpu")
    assert prefix_nll.keys() == full_nll.keys()
    assert torch.allclose(prefix_correct, full_correct, rtol=0, atol=1e-7)
    for key in full_nll:
        assert torch.allclose(prefix_nll[key], full_nll[key], rtol=0, atol=1e-6), key
    assert any((full_nll[key] - full_correct).abs().max() > 1e-4 for key in full_nll)
    batches = len(list(cache.shard_indices()))
    swept = sites(model.controller_layers)  # each decoder layer's controllers, then each alone in a layer of several
    starts = [min(model.resume_layer(c) for c in site.controllers) for site in swept]
    # per site, the passes of 3 conditions two at a time: 3 where its values hold more than a coefficient (a
    # router's output), so that the profile's coefficient alone runs apart
    values = cache.values(torch.arange(1))
    passes = [2 if all(values[c].keys() == {COEFFICIENT} for c in site.controllers) else 3 for site in swept]
    # block b runs in each batch's prefix pass and in the passes of every site that resumes at or before it
    expected = [1 + sum(p for p, start in zip(passes, starts) if start <= b) for b in range(len(model.blocks))]
    assert calls == [batches * count for count in expected]


def test_conditions_per_pass_of_a_model_without_sizes_is_one(monkeypatch):
    """On CUDA the sweep fits its conditions per pass to the memory from the config's sizes; RWKV's config names
    no heads and no scan state (its audit is given --batch-size), so its sweep resumes one condition at a time
    instead of failing."""
    rwkv = TransformersControlled(zoo.build_any("rwkv"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * 2**30, 80 * 2**30))
    with pytest.raises(UserError, match="names no heads"):
        window_bytes(rwkv, 16)
    assert conditions_per_pass(rwkv, random_windows(2, 16, seed=0), 5, "cuda") == 1
    assert conditions_per_pass(moe_s0(), random_windows(2, 16, seed=0), 5, "cuda") == 5  # sized: all at once


def test_a_mamba_is_sized_by_its_scan_state(monkeypatch):
    """A Mamba names a state size and no heads: attention-free, its window's estimate counts the scan's fp32
    discretized transition and input at every token, channel and state entry (worked out here from its config:
    width 64, inner 128, state 8, 2 layers, vocab 4096, fp32), so its audit on CUDA needs no --batch-size."""
    config_class, fields = ZOO["mamba"]
    torch.manual_seed(0)
    mamba = TransformersControlled(T.MambaForCausalLM(config_class(**COMMON, **fields)).eval())
    width, inner, state, layers, vocab, window, e = 64, 128, 8, 2, mamba.config.vocab_size, 16, 4
    assert (mamba.config.hidden_size, mamba.config.intermediate_size, mamba.config.num_hidden_layers) == (
        width,
        inner,
        layers,
    )
    ffn = max(4 * width, inner)
    per_window = (
        ((layers + 1) + 8) * window * width * e
        + 2 * window * (3 * ffn // 2) * e
        + window * vocab * (e + 12)
        + 2 * 4 * window * inner * state
    )
    assert window_bytes(mamba, window) == per_window
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * 2**30, 80 * 2**30))
    assert conditions_per_pass(mamba, random_windows(2, window, seed=0), 5, "cuda") == 5


def test_the_lm_head_runs_apart_only_where_the_logits_are_its_output():
    """moe-s0's logits are its LM head's output: the sweep runs the head a chunk of rows at a time with the NLL.
    Cohere2-MoE scales the head's output (``logit_scale``): its head stays inside the forward, and the replay
    from a layer still equals the full frozen forward."""
    mixtral = moe_s0()
    assert mixtral.separate_lm_head == [mixtral.model.get_output_embeddings()]
    cohere = TransformersControlled(zoo.build("cohere2_moe"))
    assert cohere.separate_lm_head == [] and cohere.model.config.logit_scale != 1.0
    window = random_windows(2, 16, seed=5)
    with torch.no_grad():
        _, own = cohere.capture_run(window)
    prefix = PrefixCache(cohere, window, coefficients=own)
    values = restrict_to(shifted(own), own, [1])
    with torch.no_grad():
        full = cohere.replay_run(window, values)
    assert torch.equal(prefix.logits(values, [1]), full)
    assert torch.equal(prefix.replay_nll(values, [1]), next_token_nll(full, window))


@pytest.mark.parametrize("model_type, once", [("dory", 1), ("hrm_text", 0)])
def test_a_looped_model_steps_from_the_layers_before_its_loop(model_type, once, tmp_path):
    """Dory's input layer runs once before its looped layer; HRM's first layer runs again in every cycle. The
    states kept are those before the layers that run once, a replay at any call of a looped gate resumes from
    the last of them, and it equals the full frozen forward, as the sweep's rows equal the full forwards'."""
    model = TransformersControlled(zoo.build_any(model_type))
    window = random_windows(2, 16, seed=6)
    with torch.no_grad():
        _, own = model.capture_run(window)
    prefix = PrefixCache(model, window, coefficients=own)
    assert model.stepping_depth == once and len(prefix.states) == once + 1
    assert [model.resume_layer(i) for i in range(len(own))] == [min(layer, once) for layer in model.controller_layers]
    for layer in range(prefix.num_controllers):
        values = restrict_to(shifted(own), own, [layer])
        with torch.no_grad():
            full = next_token_nll(model.replay_run(window, values), window)
        got = prefix.replay_nll(values, [layer])
        assert torch.equal(got, full) and not torch.equal(got, prefix.nll), model.controller_names[layer]
    windows = random_windows(4, 16, seed=7)
    cache = capture(model, windows, tmp_path / "eval", batch_size=2)
    prefix_nll, prefix_correct = prefix_window_nll(model, windows, cache, ["cross_input"], None, 0, "cpu")
    full_nll, full_correct = full_forward_window_nll(model, windows, cache, ["cross_input"], None, 0, "cpu")
    assert torch.allclose(prefix_correct, full_correct, rtol=0, atol=1e-7)
    assert all(torch.allclose(prefix_nll[key], full_nll[key], rtol=0, atol=1e-6) for key in full_nll)
