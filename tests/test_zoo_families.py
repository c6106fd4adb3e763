"""Every family of transformers' causal-LM mapping, enumerated when the tests are collected: classified
(``fca_workbench.adapters.classification``), built tiny where it can be (``tests/zoo.py``), its discovered
controller kinds equal to its classification's, replayed bit for bit; and the docs' table equal to the
classification's. A family a new transformers adds fails here until it is classified.
"""

import re

import pytest
import torch
import transformers as T
import zoo
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from fca_workbench.adapters import COEFFICIENT, TransformersControlled
from fca_workbench.adapters.classification import CLASSIFIED, INDEXER, SLOW, classification_note, family_table
from fca_workbench.foundation.errors import UserError

MAPPING = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
BUILT = [t for t in MAPPING if t in CLASSIFIED and not CLASSIFIED[t].untested]
UNBUILT = [t for t in MAPPING if t in CLASSIFIED and CLASSIFIED[t].untested]


@pytest.mark.parametrize("model_type", MAPPING)
def test_every_family_of_the_mapping_is_classified(model_type):
    entry = CLASSIFIED.get(model_type)
    assert entry is not None, f"{model_type} is not classified in fca_workbench/adapters/classification.py"
    assert bool(entry.kinds) != bool(entry.static), "a family has kinds, or is static with a reason"


def test_the_classification_names_only_families_of_the_mapping():
    assert sorted(set(CLASSIFIED) - set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)) == []


@pytest.fixture(scope="module")
def ids():
    return torch.randint(1, zoo.VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("model_type", BUILT)
def test_discovery_finds_the_classified_kinds_and_replays_them_exactly(model_type, ids):
    entry = CLASSIFIED[model_type]
    controlled = TransformersControlled(zoo.build_any(model_type))
    assert tuple(sorted(set(kind.name for kind in controlled.kinds))) == entry.kinds
    assert bool(controlled.left_out) == bool(entry.left_out), controlled.left_out
    if not entry.kinds:
        return
    with torch.no_grad():
        live, values = controlled.capture_run(ids)
        replayed = controlled.replay_run(ids, values)
        shuffled = controlled.replay_run(ids, [{COEFFICIENT: v[COEFFICIENT].flip(1)} for v in values])
    assert torch.equal(replayed, live)
    assert not torch.equal(shuffled, live)  # the coefficients vary over tokens and the model uses them


@pytest.mark.parametrize("model_type", ["dory", "hrm_text"])
def test_a_gate_in_a_looped_layer_is_a_controller_per_call_each_replayed_with_its_own_values(model_type, ids):
    """HRM's stacks run in cycles and Dory's recurrent layer in a loop: each call of an attention output gate
    is a controller of its own, ``NAME@callK`` in call order, whose value is what that call's projection gave
    (read here by a plain hook); replay feeds each call its own values, so swapping two calls' changes the
    logits and the captured ones reproduce them exactly."""
    model = zoo.build_any(model_type)
    gates = {name: module for name, module in model.named_modules() if name.endswith("self_attn.gate_proj")}
    seen: dict[str, list[torch.Tensor]] = {name: [] for name in gates}
    handles = [m.register_forward_hook(lambda m, a, out, n=n: seen[n].append(out)) for n, m in gates.items()]
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
    for handle in handles:
        handle.remove()
    controlled = TransformersControlled(model)
    expected = [f"{n}@call{k}" if len(seen[n]) > 1 else n for n in gates for k in range(len(seen[n]))]
    assert controlled.controller_names == expected and max(len(calls) for calls in seen.values()) > 1
    assert {kind.name for kind in controlled.kinds} == {"attention_output_gate"} and not controlled.left_out
    with torch.no_grad():
        live, values = controlled.capture_run(ids)
        first = expected.index(next(name for name in expected if name.endswith("@call0")))  # a looped gate's
        swapped = list(values)
        swapped[first], swapped[first + 1] = values[first + 1], values[first]
        replayed, moved = controlled.replay_run(ids, values), controlled.replay_run(ids, swapped)
    outputs = [output for name in gates for output in seen[name]]
    assert all(torch.equal(v[COEFFICIENT], out) for v, out in zip(values, outputs, strict=True))
    assert torch.equal(replayed, live) and not torch.equal(moved, live)


def test_deepseek_v32s_learned_indexer_is_named_in_left_out_with_its_reason():
    controlled = TransformersControlled(zoo.build_any("deepseek_v32"))
    assert controlled.left_out == [
        f"model.layers.{i}.self_attn.indexer (DeepseekV32Indexer): {INDEXER}" for i in range(2)
    ]
    assert "learned, input-dependent attention sparsity" in INDEXER


def test_an_indexer_without_weights_is_the_attentions_own_sparsity_not_left_out():
    assert not TransformersControlled(zoo.build_any("kolibri1_1")).left_out


def test_a_looped_controller_called_more_often_in_a_replay_than_at_capture_is_refused_in_one_line(ids):
    controlled = TransformersControlled(zoo.build_any("hrm_text"))
    with torch.no_grad():
        _, values = controlled.capture_run(ids)
        controlled.model.config.H_cycles += 1  # every stack runs once more per forward
        with pytest.raises(UserError) as refused:
            controlled.replay_run(ids, values)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("controller model.L_module.layers.0.self_attn.gate_proj ")
    assert "runs more than 6 times in a replay, more than at capture" in message


def looped_inkling2() -> torch.nn.Module:
    """Inkling2-loop with a block per layer and its middle layer looped twice: the stack over depth grows
    from layer to layer, the looped layer's mixing weights are one controller per call, and the second pass
    reads messages (``message_input``) from the first."""
    config = zoo.tiny_config("inkling2_loop_text")
    config.num_hidden_layers, config.layer_types = 3, ["hybrid_sliding", "hybrid", "hybrid_sliding"]
    config.n_layers_per_attn_res_block, config.loop_num_passes = 1, 2
    config.loop_layer_index_start, config.loop_layer_index_end = 1, 2
    torch.manual_seed(0)
    return T.AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize(
    ("build", "depths"), [(lambda: zoo.build_any("inkling2_text"), {2}), (looped_inkling2, {1, 2, 3, 4})]
)
def test_inkling2_cross_layer_mixing_weights_are_the_ones_the_model_mixes_by(build, depths, ids):
    """The learned queries (random here; zero at initialisation, which mixes uniformly) weigh the stack of
    earlier blocks' states per token: the captured weights are a distribution over depth equal to a hand
    computation from each owner's inputs, the explicit mix gives the model's own kernel's logits bit for bit,
    replaying them reproduces it, and replaying another input's weights or uniform ones changes the logits."""
    model = build()
    owners = {n: m for n, m in model.named_modules() if n.endswith("_input") and hasattr(m, "query")}
    with torch.no_grad():
        for owner in owners.values():
            owner.query.normal_(0.0, 1.0)
        kernel = model(input_ids=ids, use_cache=False).logits
    controlled = TransformersControlled(model)
    mixing = [i for i, kind in enumerate(controlled.kinds) if kind.name == "cross_layer_mixing"]
    assert {controlled.controller_names[i].partition("@")[0] for i in mixing} == {f"{n}.query" for n in owners}
    seen: dict[str, list[tuple]] = {name: [] for name in owners}
    handles = [m.register_forward_pre_hook(lambda m, a, n=n: seen[n].append(a)) for n, m in owners.items()]
    with torch.no_grad():
        live, values = controlled.capture_run(ids)
    for handle in handles:
        handle.remove()
    seen_depths = set()
    for i, (block, partial, *loop_layer) in zip(mixing, [a for n in owners for a in seen[n]], strict=True):
        owner = owners[controlled.controller_names[i].partition(".query")[0]]
        stacked = torch.cat([block, partial.unsqueeze(-2)], dim=-2).float()
        normed = stacked * torch.rsqrt(stacked.square().mean(-1, keepdim=True) + owner.norm.variance_epsilon)
        query = owner.query[loop_layer[0]] if loop_layer else owner.query.view(-1, stacked.shape[-1])
        scores = torch.einsum("btdh,qh->btqd", normed, query.float()) * stacked.shape[-1] ** -0.5
        weights = values[i][COEFFICIENT]
        assert torch.allclose(weights, scores.softmax(-1), atol=1e-6)
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-6)
        seen_depths.add(weights.shape[-1])
    assert seen_depths == depths  # the stack grows with the layer; a message reads the last pass's
    other = torch.randint(1, zoo.VOCAB, ids.shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, donor = controlled.capture_run(other)
        replayed = controlled.replay_run(ids, values)
        moved = controlled.replay_run(ids, [donor[i] if i in mixing else v for i, v in enumerate(values)])
        uniform = [{COEFFICIENT: torch.full_like(v[COEFFICIENT], 1 / v[COEFFICIENT].shape[-1])} for v in values]
        flat = controlled.replay_run(ids, [uniform[i] if i in mixing else v for i, v in enumerate(values)])
    assert torch.equal(live, kernel) and torch.equal(replayed, live)
    assert not torch.equal(moved, live) and not torch.equal(flat, live)


def test_a_fused_query_gate_of_one_head_width_is_each_heads_second_half(ids):
    """MiniCPM5-MoE's ``q_gate_proj`` makes ``2 × head_dim`` columns per head, viewed per head and chunked
    into the query and the gate: the captured coefficient is exactly every head's second half (read here by a
    plain hook), and replaying another input's gates with the queries live moves the logits."""
    model = zoo.build_any("minicpm5_moe")
    seen: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if name.endswith("self_attn.q_gate_proj"):
            module.register_forward_hook(lambda m, a, out, n=name: seen.__setitem__(n, out))
    controlled = TransformersControlled(model)
    gates = [i for i, name in enumerate(controlled.controller_names) if name in seen]
    assert {kind.name for kind in controlled.kinds} == {"attention_output_gate", "router:top_k"}
    assert len(gates) == len(seen) == model.config.num_hidden_layers
    other = torch.randint(1, zoo.VOCAB, ids.shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, donor = controlled.capture_run(other)
        live, values = controlled.capture_run(ids)
        captured = dict(seen)  # the projections' outputs in the capture of ``ids``
        moved = controlled.replay_run(ids, [donor[i] if i in gates else v for i, v in enumerate(values)])
    head = model.config.head_dim
    for i in gates:
        out = captured[controlled.controller_names[i]]
        gate = out.unflatten(-1, (-1, 2 * head))[..., head:].flatten(-2)
        assert torch.equal(values[i][COEFFICIENT].reshape(gate.shape), gate)
    assert not torch.equal(moved, live)


def test_rwkv_time_mixing_key_is_a_mixing_weight_replayed_exactly(ids):
    """RWKV's time-mixing key only weighs the values in the WKV recurrence (``exp(key)`` over the time steps,
    normalized by its own running sum): a controller replayed at the projection. The captured key is the
    projection's output (read here by a plain hook), the captured keys reproduce the logits bit for bit and
    another input's move them; and, as weights of a weighted average, a constant added to one channel's key
    at every step cancels out up to float rounding, where one added at every other step does not."""
    model = zoo.build_any("rwkv")
    projections = {n: m for n, m in model.named_modules() if n.endswith("attention.key")}
    seen: dict[str, torch.Tensor] = {}
    for name, module in projections.items():
        module.register_forward_hook(lambda m, a, out, n=name: seen.__setitem__(n, out))
    controlled = TransformersControlled(model)
    keys = [i for i, kind in enumerate(controlled.kinds) if kind.name == "mixing_weight"]
    assert [controlled.controller_names[i] for i in keys] == list(projections) and not controlled.left_out
    other = torch.randint(1, zoo.VOCAB, ids.shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, donor = controlled.capture_run(other)
        live, values = controlled.capture_run(ids)
        assert all(torch.equal(values[i][COEFFICIENT], seen[controlled.controller_names[i]]) for i in keys)
        replayed = controlled.replay_run(ids, values)
        moved = controlled.replay_run(ids, [donor[i] if i in keys else v for i, v in enumerate(values)])
        shifted, uneven = list(values), list(values)
        for i in keys:
            shifted[i] = {COEFFICIENT: values[i][COEFFICIENT].clone()}
            shifted[i][COEFFICIENT][..., 3] += 5.0
            uneven[i] = {COEFFICIENT: values[i][COEFFICIENT].clone()}
            uneven[i][COEFFICIENT][:, ::2, 3] += 5.0
        same, changed = controlled.replay_run(ids, shifted), controlled.replay_run(ids, uneven)
    assert torch.equal(replayed, live) and not torch.equal(moved, live)
    assert torch.allclose(same, live, atol=1e-5) and (changed - live).abs().max() > 1e-2


@pytest.mark.parametrize("model_type", UNBUILT)
def test_a_family_the_zoo_cannot_build_tiny_says_why(model_type):
    """The reason is checked, not trusted: building the family tiny and probing it fails (when it stops
    failing, the family is to be built and its kinds asserted); one that takes minutes to build is skipped."""
    if CLASSIFIED[model_type].untested.startswith(SLOW):
        pytest.skip(CLASSIFIED[model_type].untested)
    with pytest.raises(Exception):  # noqa: B017  (whatever the family's own config or modelling code raises)
        TransformersControlled(zoo.build_any(model_type))


def test_a_model_type_the_classification_does_not_know_gets_one_line():
    note = classification_note("brand_new", ["router:top_k", "attention_output_gate", "router:top_k"], ["x"])
    assert note is not None and "\n" not in note
    assert "'brand_new' is not in" in note and "attention_output_gate, router:top_k; 1 left out" in note
    assert classification_note("llama", [], []) is None


def test_a_model_of_a_family_nobody_classified_is_audited_with_one_line_saying_so(capsys):
    """The family is audited with what discovery finds (AFMoE's router and attention gates, under a name
    the classification does not know), and one stderr line says so."""
    model = zoo.build_any("afmoe")
    model.config.model_type = "afmoe_next"
    capsys.readouterr()
    controlled = TransformersControlled(model)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fca: note: model_type 'afmoe_next' is not in")
    assert "discovery found: attention_output_gate, router:top_k" in err
    assert "model.layers.0.self_attn.gate_proj" in controlled.controller_names


def test_the_family_table_in_the_docs_is_the_classifications():
    text = (zoo.ROOT / "docs" / "guides" / "families.md").read_text(encoding="utf-8")
    committed = re.search(r"<!-- classification -->\n(.*?)<!-- /classification -->", text, re.S)
    assert committed is not None and committed.group(1) == family_table()
    rows = [line for line in committed.group(1).splitlines()[2:]]
    assert len(rows) == len(CLASSIFIED) and all(f"| `{t}` |" in "\n".join(rows) for t in MAPPING)
