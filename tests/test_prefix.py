"""The prefix cache: a replay from layer l gives exactly the full forward's logits, for every family."""

import pytest
import torch
from conftest import tiny_model

from fca_workbench.audit.interventions import restrict_to
from fca_workbench.audit.prefix import PrefixCache, PrefixStore

LAYERS = 3


@pytest.fixture
def window():
    return torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(3))


def perturbed(coefficients, seed=7):
    generator = torch.Generator().manual_seed(seed)
    return [c + 0.3 * torch.randn(c.shape, generator=generator) for c in coefficients]


def test_layer_stepping_reproduces_forward(arch, window):
    model = tiny_model(arch, layers=LAYERS)
    with torch.no_grad():
        full = model(window, return_coefficients=True)
        output, used, states = model.run_blocks(model.embed(window), 0, None, keep_states=True)
        assert torch.equal(model.head(output), full.logits)
        assert len(states) == LAYERS + 1
        assert all(torch.equal(a, b) for a, b in zip(used, full.coefficients))
        for start in range(LAYERS + 1):  # from every kept state, with the model's own coefficients
            output, _, _ = model.run_blocks(states[start], start, full.coefficients or None)
            assert torch.equal(model.head(output), full.logits), f"start={start}"


def test_replay_from_layer_equals_full_forward(arch, window):
    model = tiny_model(arch, layers=LAYERS)
    cache = PrefixCache(model, window)
    with torch.no_grad():
        full = model(window, return_coefficients=True)
    expected = -full.logits[:, :-1].log_softmax(-1).gather(-1, window[:, 1:, None]).squeeze(-1)
    assert torch.allclose(cache.nll, expected, rtol=0, atol=1e-5)
    if arch == "dense":
        assert cache.coefficients == []
        return
    other = perturbed(cache.coefficients)
    for layer in range(LAYERS):
        coefficients = restrict_to(other, cache.coefficients, [layer])
        with torch.no_grad():
            expected = model(window, coefficients=coefficients).logits
        got = cache.logits(coefficients, [layer])
        assert torch.equal(got, expected), f"layer {layer}"
        assert not torch.equal(got, full.logits)  # the intervention really changed something
    with torch.no_grad():
        expected = model(window, coefficients=other).logits
    assert torch.equal(cache.logits(other), expected)  # all layers: from the embeddings


def test_replay_skips_layers_before_l_and_never_runs_the_controller(arch, window):
    model = tiny_model(arch, layers=LAYERS)
    cache = PrefixCache(model, window)
    if arch == "dense":
        pytest.skip("no coefficients to intervene on")
    calls = {"blocks": [], "controllers": 0}
    hooks = [
        block.register_forward_hook(lambda m, i, o, n=n: calls["blocks"].append(n))
        for n, block in enumerate(model.blocks)
    ]
    hooks += [
        c.register_forward_hook(lambda *a: calls.__setitem__("controllers", calls["controllers"] + 1))
        for c in model.controllers
    ]
    try:
        layer = 1
        cache.logits(restrict_to(perturbed(cache.coefficients), cache.coefficients, [layer]), [layer])
    finally:
        for hook in hooks:
            hook.remove()
    assert calls["controllers"] == 0
    assert calls["blocks"] == list(range(model.resume_layer(layer), LAYERS))
    assert min(calls["blocks"], default=LAYERS) >= layer


def test_out_of_range_layer_and_bad_shapes(window):
    model = tiny_model("featuregate", layers=LAYERS)
    cache = PrefixCache(model, window)
    with pytest.raises(ValueError, match="out of range"):
        cache.logits(cache.coefficients, [LAYERS])
    with pytest.raises(ValueError, match="shape"):
        cache.logits([c[:, :-1] for c in cache.coefficients], [0])


def test_store_is_bounded_and_clears(window):
    model = tiny_model("featuregate", layers=LAYERS)
    store = PrefixStore(max_entries=2)
    built = []
    for key in range(4):
        store.get(key, lambda: built.append(1) or PrefixCache(model, window))
    assert len(store) == 2 and len(built) == 4
    store.get(3, lambda: pytest.fail("should be cached"))
    one = store.nbytes // 2
    small = PrefixStore(max_entries=10, max_bytes=one + 1)
    for key in range(3):
        small.get(key, lambda: PrefixCache(model, window))
    assert len(small) == 1  # the byte budget holds one window's cache
    store.clear()
    assert len(store) == 0 and store.nbytes == 0


def test_a_transformers_moe_replays_from_the_layer_without_running_a_router(tiny_mixtral):
    """A transformers MoE keeps the state before every decoder layer: a one-layer replay resumes at the layer
    and equals the protocol's full frozen forward with the window's own router outputs elsewhere
    (``replay_run``); no router executes (tests/test_prefix_transformers.py: more families, the sweep)."""
    from fca_workbench.adapters.controlled import load_controlled

    model = load_controlled(tiny_mixtral)
    window = torch.randint(1, 4096, (1, 16), generator=torch.Generator().manual_seed(3))
    cache = PrefixCache(model, window)
    assert len(cache.states) == 3 and cache.num_controllers == 2 and cache.start_for([1]) == 1
    with torch.no_grad():
        live = model(window).logits
    assert torch.equal(cache.logits(cache.values), live)  # correct: the whole router outputs, bit-exact
    shifted = [{name: t.roll(1, dims=1) for name, t in value.items()} for value in cache.values]
    values = restrict_to(shifted, cache.values, [1])
    router_class = type(model.controllers[0])
    runs, original = [], router_class.forward
    router_class.forward = lambda self, *a, **k: runs.append(1) or original(self, *a, **k)
    try:
        got = cache.logits(values, [1])
    finally:
        router_class.forward = original
    with torch.no_grad():
        assert torch.equal(got, model.replay_run(window, values))
    assert runs == [] and not torch.equal(got, live)
